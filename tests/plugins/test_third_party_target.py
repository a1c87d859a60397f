"""A third-party exporter registered under the ``autoplan.exporters`` entry points is a CLI
target like the built-in ones (``export --to`` and ``solve --export`` list and run it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

PLAN = Path(__file__).parent / "data" / "gpt13b_ethernet_10g.json"

EXPORTER = textwrap.dedent('''
    from autoplan.plugins.exporter import Exporter

    def render(result):
        return {"hello.txt": f"tp={result.plan.tp} pp={result.plan.pp}\\n"}

    exporter = Exporter(name="hello", description="a test target", render=render)
''')

RUN = textwrap.dedent('''
    import sys
    from typer.testing import CliRunner
    from autoplan.cli import app
    help_text = CliRunner().invoke(app, ["export", "--help"]).output
    assert "hello" in help_text, help_text
    result = CliRunner().invoke(app, ["export", sys.argv[1], "--to", "hello", "--out", sys.argv[2]])
    assert result.exit_code == 0, result.output
''')


def test_an_entry_point_exporter_is_a_cli_target(tmp_path):
    (tmp_path / "hello_exporter.py").write_text(EXPORTER)
    info = tmp_path / "hello_exporter-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hello-exporter\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[autoplan.exporters]\nhello = hello_exporter:exporter\n")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", RUN, str(PLAN), str(out)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    plan = json.loads(PLAN.read_text())["plan"]
    assert (out / "hello.txt").read_text() == f"tp={plan['tp']} pp={plan['pp']}\n"

"""Bad model.py files: exit code 2 and a message that says what to change, never a traceback."""

from __future__ import annotations

import textwrap

import pytest
from typer.testing import CliRunner

from autoplan.cli import app

HEADER = "import torch\nfrom torch import nn\n"
CASES = {
    "no_build": ("x = 1\n", "defines no build_model()"),
    "raises": ("def build_model():\n    raise RuntimeError('boom')\n", "build_model() raised RuntimeError: boom"),
    "not_module": ("def build_model():\n    return 3\n", "returned int, not a torch.nn.Module"),
    "real_param": ("def build_model():\n    return nn.Linear(4, 4, device='cpu')\n",
                   "created real tensors"),
    "real_in_forward": ("""
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(16, 8)
            def forward(self, x):
                return self.emb(x) + torch.ones(8, device='cpu')
        def build_model():
            return M()
        """, "real (non-meta) tensor"),
    "data_dependent": ("""
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(16, 8)
            def forward(self, x):
                h = self.emb(x)
                return h * 2 if h.sum() > 0 else h
        def build_model():
            return M()
        """, "depend on shapes or config"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_model_file_exits_2_with_advice(case, tmp_path):
    body, expected = CASES[case]
    path = tmp_path / f"{case}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    result = CliRunner().invoke(app, ["trace", str(path), "--seq-len", "8"])
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.output.split())
    assert "Traceback" not in result.output

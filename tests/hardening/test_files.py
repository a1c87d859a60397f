"""autoplan/files.py: every file autoplan writes goes through a temporary file and a rename, and
a user's file is overwritten only when asked."""

from __future__ import annotations

import pytest

from autoplan import api
from autoplan import sweep as sweeps
from autoplan.errors import OutputExistsError
from autoplan.files import refuse_existing, replacing, write_atomically


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "sweep.csv"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with replacing(target) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.csv"]


def test_the_temporary_keeps_the_suffix_and_sits_next_to_the_target(tmp_path):
    with replacing(tmp_path / "sub" / "plot.png") as tmp:
        assert tmp.suffix == ".png" and tmp.parent == tmp_path / "sub"
        tmp.write_bytes(b"png")
    assert (tmp_path / "sub" / "plot.png").read_bytes() == b"png"
    assert write_atomically(tmp_path / "run.sh", "#!/bin/sh\n").stat().st_mode & 0o111


def test_refusal_names_every_existing_file(tmp_path):
    (tmp_path / "a").write_text("")
    (tmp_path / "b").write_text("")
    with pytest.raises(OutputExistsError, match=r"a, .*b already exist; pass --force"):
        refuse_existing([tmp_path / "a", tmp_path / "b", tmp_path / "c"])


def test_write_sweep_refuses_before_writing_anything_and_force_overwrites(tmp_path):
    doc = {"points": []}
    (tmp_path / "sweep.json").write_text("mine")
    with pytest.raises(OutputExistsError, match="sweep.json"):
        sweeps.write_sweep(doc, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]
    sweeps.write_sweep(doc, tmp_path, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.csv", "sweep.json"]
    assert (tmp_path / "sweep.json").read_text() != "mine"


# --out that cannot take the files: refused with exit 2 before the solve or sweep starts.
TINY = "examples/models/tiny_gpt.py"
DGX1 = "examples/clusters/dgx-a100-x1.yaml"
SOLVE_EXPORT = ["solve", TINY, DGX1, "--seq-len", "256", "--global-batch", "16",
                "--export", "megatron", "--out"]
SWEEP = ["sweep", TINY, DGX1, "--seq-len", "256", "--global-batch", "16",
         "--over", "nodes=1", "--out"]


@pytest.fixture
def no_solving(monkeypatch, examples):
    """Fail the test if a solve or sweep starts: the --out check must come first."""
    monkeypatch.chdir(examples.parent)

    def started(*args, **kwargs):
        raise AssertionError("the solve started before --out was checked")

    monkeypatch.setattr(api, "solve", started)
    monkeypatch.setattr(sweeps, "sweep", started)


def _cli(args):
    from typer.testing import CliRunner

    from autoplan.cli import app
    result = CliRunner().invoke(app, args)
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize("command", [SOLVE_EXPORT, SWEEP], ids=["solve-export", "sweep"])
def test_out_naming_an_existing_file_exits_2_before_the_solve(tmp_path, no_solving, command):
    mine = tmp_path / "results"
    mine.write_text("mine")
    code, output = _cli([*command, str(mine)])
    assert code == 2, output
    assert f"--out {mine} is an existing file, not a folder" in output
    assert mine.read_text() == "mine"


@pytest.mark.parametrize("command", [SOLVE_EXPORT, SWEEP], ids=["solve-export", "sweep"])
def test_out_below_a_file_exits_2_before_the_solve(tmp_path, no_solving, command):
    (tmp_path / "file").write_text("")
    code, output = _cli([*command, str(tmp_path / "file" / "out")])
    assert code == 2, output
    assert "is a file, so the folder cannot be created" in output


@pytest.mark.parametrize("command", [SOLVE_EXPORT, SWEEP], ids=["solve-export", "sweep"])
def test_read_only_out_exits_2_before_the_solve(tmp_path, no_solving, monkeypatch, command):
    """A read-only mount refuses every new file with EROFS (the error `solve --export` died of);
    simulated here, since root writes into a chmod-ed folder regardless."""
    import errno
    import tempfile

    def read_only(*args, dir=None, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(dir))

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    code, output = _cli([*command, str(tmp_path / "out")])
    assert code == 2, output
    assert f"nothing can be written in {tmp_path} (Read-only file system)" in output


def test_a_write_that_fails_after_the_check_is_one_clear_error(tmp_path, monkeypatch):
    """The disk can fill (or the folder turn read-only) between the check and the write."""
    import errno
    import tempfile

    def full(*args, prefix="", dir=None, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", f"{dir}/{prefix}")

    monkeypatch.setattr(tempfile, "mkstemp", full)
    with pytest.raises(OutputExistsError, match=r"writing .*sweep\.csv.* failed \(No space left"):
        sweeps.write_sweep({"points": []}, tmp_path)

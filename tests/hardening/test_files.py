"""autoplan/files.py: every file autoplan writes goes through a temporary file and a rename, and
a user's file is overwritten only when asked."""

from __future__ import annotations

import pytest

from autoplan import api
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
        api.write_sweep(doc, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]
    api.write_sweep(doc, tmp_path, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.csv", "sweep.json"]
    assert (tmp_path / "sweep.json").read_text() != "mine"

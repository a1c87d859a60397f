"""Writing exported files: all or nothing about overwrites, each file atomically.

A launch directory is often shared (NFS) and read by running jobs, so a file is written to a
temporary name in the same directory and renamed over the target: readers see the old file or the
new one, never half of one. Existing files are checked before anything is written, so a refused
export leaves the directory as it was.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from autoplan.errors import ExportError

EXECUTABLE_SUFFIXES = (".sh",)


def refuse_existing(names: list[str], out_dir: Path) -> None:
    """Raise if any of ``names`` already exists in ``out_dir``.

    Raises:
        ExportError: naming every file that would be overwritten.
    """
    existing = [str(out_dir / name) for name in names if (out_dir / name).exists()]
    if existing:
        raise ExportError(
            f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; pass --force "
            "(force=True) to overwrite, or export into an empty directory."
        )


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename; ``.sh`` files get the
    executable bits."""
    mode = 0o755 if path.suffix in EXECUTABLE_SUFFIXES else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_files(files: dict[str, str], out_dir: Path) -> list[Path]:
    """Write ``{file name: text}`` into ``out_dir`` (created if missing), replacing what is
    there; return the paths in the order given. Call :func:`refuse_existing` first unless
    overwriting was asked for."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.items():
        path = out_dir / name
        write_atomically(path, text)
        paths.append(path)
    return paths

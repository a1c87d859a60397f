"""Writing the files autoplan produces: all or nothing about overwrites, each file atomically.

Used for launch files (exporters), sweep tables and figures, plan plots and the topology PNG.
A launch or results directory is often shared (NFS) and read by running jobs, so a file is
written to a temporary name in the same directory and renamed over the target: readers see the
old file or the new one, never half of one. Existing files are checked before anything is
written, so a refused write leaves the directory as it was.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from autoplan.errors import AutoplanError, OutputExistsError

EXECUTABLE_SUFFIXES = (".sh",)


def check_writable_folder(folder: Path, *, flag: str = "--out",
                          error: type[AutoplanError] = OutputExistsError) -> None:
    """Refuse a ``folder`` that names an existing file or lies where nothing can be written
    (a read-only mount, no permission), so that work that takes minutes is not thrown away at
    the end. A missing folder is fine when its nearest existing parent takes new entries.

    Raises:
        AutoplanError: (``error``) saying what is wrong and what to give instead.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise error(f"{flag} {folder} is an existing file, not a folder; give a folder (it is "
                    "created if missing) for the files to go in.")
    parent = folder
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise error(f"{flag} {folder}: {parent} is a file, so the folder cannot be created; "
                    "give a folder path that is not below a file.")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as err:
        raise error(f"{flag} {folder}: nothing can be written in {parent} ({err.strerror}); "
                    "give a folder you can write to.") from None


def refuse_existing(paths: Iterable[Path], *,
                    error: type[AutoplanError] = OutputExistsError) -> None:
    """Raise ``error`` if any of ``paths`` already exists.

    Raises:
        AutoplanError: (``error``) naming every file that would be overwritten.
    """
    existing = [str(path) for path in paths if Path(path).exists()]
    if existing:
        raise error(
            f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; pass --force "
            "(force=True) to overwrite, or write into an empty directory."
        )


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path next to ``path`` (same suffix, so writers that pick a format by suffix
    work) that is renamed over ``path`` when the block ends without an exception, and removed
    when it raises. ``.sh`` files get the executable bits, others 0644."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o755 if path.suffix in EXECUTABLE_SUFFIXES else 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomically(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` through a temporary file and a
    rename; return ``path``."""
    with replacing(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
    return Path(path)


def write_files(files: dict[str, str], out_dir: Path) -> list[Path]:
    """Write ``{file name: text}`` into ``out_dir`` (created if missing), replacing what is
    there; return the paths in the order given. Call :func:`refuse_existing` first unless
    overwriting was asked for."""
    out_dir = Path(out_dir)
    return [write_atomically(out_dir / name, text) for name, text in files.items()]


@contextmanager
def write_errors_as(error: type[AutoplanError], flag: str = "--out") -> Iterator[None]:
    """Turn an OSError raised while writing (a disk that filled, a folder made read-only since
    it was checked) into ``error`` with the system's reason."""
    try:
        yield
    except OSError as err:
        raise error(f"{flag}: writing {err.filename or 'a file'} failed ({err.strerror}); "
                    "free space or give a folder you can write to.") from None

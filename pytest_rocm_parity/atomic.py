"""Atomic file replacement: a reader sees the old file or the new one, never a part of either.

Every file the package writes goes through here: the content is written to a temporary file
in the target's own directory (same file system, so ``os.replace`` is atomic), given the
permissions an ordinary ``open()`` would give it, and renamed over the target. A failure
leaves the target as it was and removes the temporary file. Temporary names start with
``.tmp-``, which the golden store's garbage collection recognises as a dead writer's.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

TMP_PREFIX = ".tmp-"


def _file_mode() -> int:
    """What open() gives a new file here: 0o666 less the umask (0644 under the usual 022).

    mkstemp creates 0600 files, which a teammate's checkout or a shared artifact cannot read.
    """
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _file_mode()


def temp_beside(directory: str | os.PathLike[str], suffix: str = "") -> Path:
    """A new, empty temporary file in ``directory`` (for writers that must see the bytes before
    they know the final name, such as content-addressed files)."""
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=suffix, dir=directory)
    os.close(fd)
    return Path(tmp)


def sync(path: str | os.PathLike[str]) -> None:
    """Flush a file's bytes to the disk, so a power cut after the rename cannot leave it empty."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def commit(tmp: str | os.PathLike[str], target: str | os.PathLike[str], *, durable: bool = False) -> Path:
    """Rename a finished temporary file over ``target`` with ordinary permissions."""
    if durable:
        sync(tmp)
    os.chmod(tmp, FILE_MODE)
    os.replace(tmp, target)
    return Path(target)


def atomic_write(target: str | os.PathLike[str], content: str | bytes | Callable[[Path], Any], *,
                 durable: bool = False) -> Path:
    """Replace ``target`` with ``content``: text (UTF-8), bytes, or a callable that writes the
    file at the path it is given. ``durable`` fsyncs before the rename (goldens; not reports)."""
    target = Path(target)
    tmp = temp_beside(target.parent, suffix=target.suffix)
    try:
        if isinstance(content, str):
            tmp.write_text(content, encoding="utf-8")
        elif isinstance(content, bytes):
            tmp.write_bytes(content)
        else:
            content(tmp)
        return commit(tmp, target, durable=durable)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

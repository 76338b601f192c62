"""A ``memory://`` golden store of a test's own, emptied afterwards: fsspec's memory filesystem is one
per process, so stores of two tests would otherwise see each other's goldens."""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator


@contextlib.contextmanager
def memory_url(prefix: str, test_name: str) -> Iterator[str]:
    """``memory://<prefix>-<test_name>/goldens``, its top folder removed on exit."""
    import fsspec

    u = f"memory://{prefix}-{re.sub(r'[^A-Za-z0-9_-]', '_', test_name)}/goldens"
    yield u
    fs = fsspec.filesystem("memory")
    top = "/" + u.split("://", 1)[1].split("/")[0]
    if fs.exists(top):
        fs.rm(top, recursive=True)

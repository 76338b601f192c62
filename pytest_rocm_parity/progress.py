"""Progress lines during capture and replay: the one place the engine reports what it is doing.

The engine (capture, replay, golden I/O) calls ``progress("float32: reference forward")``; the
pytest session installs a sink that writes ``parity: <check>: <message>`` through pytest's terminal
reporter. Outside pytest (or under an xdist worker, whose terminal is not shown) no sink is set
and a call costs one attribute read. ``verbose=1`` lines show only with ``pytest -v``.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

# fn(line, verbose level) -> None, set by the session for the length of the run
_sink: Callable[[str, int], None] | None = None
# the check being captured or replayed; a module global (not a context variable) so lines from
# the engine's helper threads carry it too; checks of one process run one at a time
_check: str = ""


def progress(message: str, verbose: int = 0) -> None:
    """Report one step of the check in progress (``verbose=1``: shown only with ``-v``)."""
    sink = _sink
    if sink is None:
        return
    prefix = f"parity: {_check}: " if _check else "parity: "
    try:
        sink(prefix + message, verbose)
    except Exception:  # a progress line must never fail a check
        pass


@contextlib.contextmanager
def checking(name: str) -> Iterator[None]:
    """Lines reported inside this block are prefixed with the check's name."""
    global _check
    saved, _check = _check, name
    try:
        yield
    finally:
        _check = saved


def set_sink(sink: Callable[[str, int], None] | None) -> None:
    global _sink
    _sink = sink


def megabytes(n: int) -> str:
    """12.3 MB (10**6 bytes, as the size limit and GitHub's file limit count them)."""
    if n < 1_000_000:
        return f"{n / 1000:.1f} KB"
    return f"{n / 1e6:.1f} MB"

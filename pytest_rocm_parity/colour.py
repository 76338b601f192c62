"""Colour for the ``rocm-parity`` commands: on a terminal only, never with NO_COLOR.

https://no-color.org: a non-empty ``NO_COLOR`` turns colour off; ``FORCE_COLOR`` (non-empty)
turns it on where the output is not a terminal (CI logs that render ANSI); a pipe, a file or
``TERM=dumb`` get plain text.
"""
from __future__ import annotations

import os
from typing import IO, Any

CODES = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "cyan": "36", "bold": "1", "dim": "2"}
SEVERITY = {"error": "red", "warning": "yellow", "note": "cyan"}


def enabled(stream: IO[Any] | Any) -> bool:
    """Whether text written to ``stream`` should carry ANSI colour."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):   # a closed or detached stream
        return False


def paint(text: str, style: str, on: bool) -> str:
    """``text`` in ``style`` (a key of CODES, or several joined by '+') when ``on``; unchanged otherwise."""
    if not on or not text:
        return text
    codes = ";".join(CODES[s] for s in style.split("+"))
    return f"\033[{codes}m{text}\033[0m"

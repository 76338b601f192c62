"""Tables, the one route: fixed-width text for terminals, pandas for CSV files and DataFrames.

``text_table`` prints every text table of the package (the terminal summary, a failure's
layer table, ``show``/``diff``, ``ops``, ``scan``, ``doctor`` and the CLI listings). It is
plain Python on purpose: the terminal summary and ``rocm-parity scan`` must not pay for
importing pandas. ``frame`` and ``write_csv`` turn rows (dicts) into a DataFrame and a CSV
file: the report's ``checks.csv`` / ``layers.csv`` and ``CheckResult.to_frame()`` go
through them, and pandas is imported only when they are called.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import pandas as pd

Row = Union[Sequence[Any], str]
# style(row, column, padded cell) -> the cell as printed; row -1 is the header
Style = Callable[[int, int, str], str]


def text_table(rows: Iterable[Row], headers: Sequence[str] | None = None, *, right: Iterable[int] = (),
               widths: Sequence[int | None] | None = None, indent: str = "", rule: bool = False,
               style: Style | None = None, sep: str = "  ") -> list[str]:
    """Lines of a fixed-width table, each right-stripped.

    ``rows``: sequences of cells (``str()`` of each) or plain strings, printed as they are
    (notes between rows; they never widen a column). ``right``: indexes of right-aligned
    columns. ``widths``: a fixed width per column (None: as wide as its widest cell); a
    longer cell overflows. ``rule``: a dashed line under the header. ``style``: paints
    a padded cell (colour), after the widths are fixed.
    """
    body = [r if isinstance(r, str) else [str(c) for c in r] for r in rows]
    cells = [r for r in body if not isinstance(r, str)]
    head = list(headers) if headers is not None else None
    ncol = max([len(r) for r in cells] + [len(head) if head is not None else 0])
    fixed = list(widths or [])
    width = []
    for i in range(ncol):
        w = fixed[i] if i < len(fixed) else None
        if w is None:
            w = max([len(r[i]) for r in cells if i < len(r)] + [len(head[i]) if head and i < len(head) else 0])
        width.append(w)
    aligned = set(right)

    def line(row: Sequence[str], index: int) -> str:
        out = []
        for i, c in enumerate(row):
            padded = c.rjust(width[i]) if i in aligned else c.ljust(width[i])
            out.append(style(index, i, padded) if style is not None else padded)
        return (indent + sep.join(out)).rstrip()

    lines = []
    if head is not None:
        lines.append(line(head, -1))
        if rule:
            lines.append(line(["-" * w for w in width], -1))
    index = 0
    for r in body:
        if isinstance(r, str):
            lines.append(r)
        else:
            lines.append(line(r, index))
            index += 1
    return lines


def frame(rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None) -> pd.DataFrame:
    """A DataFrame of dict rows; columns in first-seen order (or ``columns``)."""
    import pandas as pd

    rows = list(rows)
    if columns is None:
        seen: dict[str, None] = {}
        for r in rows:
            seen.update(dict.fromkeys(r))
        columns = list(seen)
    return pd.DataFrame.from_records(rows, columns=list(columns))


def write_csv(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str],
              columns: Sequence[str] | None = None) -> Path:
    """Write dict rows as a CSV file (atomically), through :func:`frame`."""
    from pytest_rocm_parity.atomic import atomic_write

    df = frame(rows, columns)
    return atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))

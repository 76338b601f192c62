"""Fixtures for the reliability tests; the helpers live in reliability_helpers.py."""
from __future__ import annotations

from pathlib import Path

import hypothesis  # noqa: F401  (imported once here: pytester runs would re-import it each time)
import pytest

import pytest_rocm_parity.judging.assertion  # noqa: F401
import pytest_rocm_parity.migration.doctor  # noqa: F401
import pytest_rocm_parity.reports.summary  # noqa: F401
from reliability_helpers import Golden, make_golden


@pytest.fixture
def golden(tmp_path: Path) -> Golden:
    """A float32 golden of the tiny model, captured into tmp_path/goldens."""
    return make_golden(tmp_path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The soak tests (@pytest.mark.slow) run only when asked: -m slow, or RELIABILITY_SLOW=1."""
    import os

    markexpr = config.getoption("markexpr") or ""
    if os.environ.get("RELIABILITY_SLOW") == "1" or ("slow" in markexpr and "not slow" not in markexpr):
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="soak test: run with -m slow (or RELIABILITY_SLOW=1)")
    for item in items:
        if item.get_closest_marker("slow") is not None and here in Path(str(item.path)).parents:
            item.add_marker(skip)

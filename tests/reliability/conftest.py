"""Fixtures for the reliability tests; the helpers live in reliability_helpers.py."""
from __future__ import annotations

from pathlib import Path

import hypothesis  # noqa: F401  (imported once here: pytester runs would re-import it each time)
import pytest

import pytest_rocm_parity.assertion  # noqa: F401
import pytest_rocm_parity.doctor  # noqa: F401
import pytest_rocm_parity.summary  # noqa: F401
from reliability_helpers import Golden, make_golden


@pytest.fixture
def golden(tmp_path: Path) -> Golden:
    """A float32 golden of the tiny model, captured into tmp_path/goldens."""
    return make_golden(tmp_path)

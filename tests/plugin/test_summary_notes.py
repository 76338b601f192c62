"""A passing check's notes (what was not judged, and why) reach the terminal with -v."""
from __future__ import annotations

import pytest


def test_a_passing_checks_notes_show_with_verbose(project: pytest.Pytester) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    quiet = project.runpytest("--rocm-parity", "--parity-replay=fast")
    quiet.assert_outcomes(passed=1)
    assert "note:" not in quiet.stdout.str()
    verbose = project.runpytest("--rocm-parity", "--parity-replay=fast", "-v")
    verbose.assert_outcomes(passed=1)
    # a fast replay says what it did not judge
    verbose.stdout.fnmatch_lines(["PASS tiny *", "     note: fast replay (--parity-replay=fast)*propagated drift not judged*"])

"""parity_ops: a session-scoped compare_op for @given tests, bound to --parity-device."""
from __future__ import annotations

import re

import pytest

GIVEN_TEST = '''
import torch
from hypothesis import given, settings, strategies as st

@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 40))
def test_softmax(parity_ops, n):
    assert parity_ops.device == "cpu"
    x = torch.linspace(-3, 3, n)
    parity_ops.compare_op(lambda t: torch.softmax(t, -1), lambda t: torch.softmax(t, -1), x)

@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40))
def test_planted_bug(parity_ops, n):
    x = torch.linspace(-3, 3, n)
    bad = lambda t: torch.softmax(t, -1) * (1.01 if t.numel() > 17 else 1.0)
    parity_ops.compare_op(bad, lambda t: torch.softmax(t, -1), x)
'''


def test_given_with_session_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_ops=GIVEN_TEST)
    result = pytester.runpytest("--parity-device=cpu", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    # Hypothesis names the shrunk case "Falsifying example" (<= 6.16x) or "Failing test case" (newer)
    assert re.search(r"(Falsifying example|Failing test case): test_planted_bug\(", out), out[-2000:]
    assert re.search(r"\bn=18,", out)
    assert "HealthCheck" not in result.stdout.str()

"""The advice docs/fuzzing.md gives for a FlakyFailure: an output the kernel never wrote (a grid too
small, the output from torch.empty) holds whatever memory held, so it fails only sometimes; filled
with NaN instead, the same kernel fails on every run, at exactly the elements it did not write."""
from __future__ import annotations

import pytest

from interpreted import run_interpreted

pytestmark = pytest.mark.triton
pytest.importorskip("triton")

# Triton reads TRITON_INTERPRET on import: the kernel runs in a process of its own
PROBE = '''
import json, os
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
from pytest_rocm_parity.fuzz.harness import check_op

@triton.jit
def _scale(X, Y, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + o, tl.load(X + o, mask=o < N) * 2.0, mask=o < N)

def launch(x, fill, programs):
    y = torch.full_like(x, fill)
    _scale[(programs(x.numel()),)](x, y, x.numel(), BLOCK=16)
    return y

too_small = lambda x: launch(x, float("nan"), lambda n: n // 16)       # the tail block never runs
covering = lambda x: launch(x, float("nan"), lambda n: triton.cdiv(n, 16))
x = torch.linspace(-1, 1, 40)
bad = check_op(too_small, lambda t: t * 2, x, device="cpu")
print(json.dumps({"bad": [check_op(too_small, lambda t: t * 2, x, device="cpu").passed for _ in range(3)],
                  "reason": bad.outputs[0].reason, "mismatches": bad.outputs[0].mismatches,
                  "good": check_op(covering, lambda t: t * 2, x, device="cpu").passed}))
'''


def test_an_output_the_kernel_never_wrote_fails_every_run_once_filled_with_nan() -> None:
    found = run_interpreted(PROBE)
    assert found["bad"] == [False, False, False] and found["good"] is True, found
    assert found["mismatches"] == 40 - 32 and "NaN/inf where the truth is finite" in found["reason"], found

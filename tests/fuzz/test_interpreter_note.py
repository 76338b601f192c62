"""A compare_op failure at bfloat16 under Triton's interpreter says that the interpreter computes
bfloat16 wrongly, as the model check's float ladder does: otherwise it reads as a kernel bug."""
from __future__ import annotations

import pytest

from interpreted import run_interpreted

pytestmark = pytest.mark.triton
pytest.importorskip("triton")

SCRIPT = '''
import json
import torch, triton, triton.language as tl
from pytest_rocm_parity.fuzz.harness import check_op

@triton.jit
def _twice(X, Y, BLOCK: tl.constexpr, ACC: tl.constexpr):
    """x + x, accumulated in ACC: a correct kernel, which the interpreter gets wrong in bfloat16."""
    acc = tl.zeros([BLOCK], dtype=ACC)
    x = tl.load(X + tl.arange(0, BLOCK))
    acc += x
    acc += x
    tl.store(Y + tl.arange(0, BLOCK), acc)

def twice(x):
    y = torch.empty_like(x)
    acc = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[x.dtype]
    _twice[(1,)](x, y, BLOCK=x.numel(), ACC=acc)
    return y

def reference(x):
    return x + x

rows = {}
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    r = check_op(twice, reference, torch.ones(8, dtype=dtype), device="cpu")
    rows[str(dtype)] = [r.passed, r.notes, r.message() if not r.passed else ""]
print(json.dumps(rows))
'''


def test_a_bfloat16_mismatch_in_the_interpreter_carries_the_interpreters_note() -> None:
    from pytest_rocm_parity.fuzz.harness import INTERPRETER_BF16_NOTE

    rows = run_interpreted(SCRIPT)
    passed, notes, message = rows["torch.bfloat16"]
    assert not passed and notes == [INTERPRETER_BF16_NOTE], rows
    assert f"Note: {INTERPRETER_BF16_NOTE}\nCandidate: " in message, message
    # float16 the interpreter computes as a GPU does: it passes, and a pass carries no note
    assert rows["torch.float16"][:2] == [True, []] and rows["torch.float32"][:2] == [True, []], rows


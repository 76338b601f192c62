"""The fact docs/fuzzing.md states about Triton's CPU interpreter: it rounds float32 to bfloat16 by
truncation, not to nearest, so an interpreted kernel that stores bfloat16 has about twice the error
of a GPU's. A Triton that rounds to nearest fails this test, and the doc's warning goes."""
from __future__ import annotations

import pytest

from interpreted import run_interpreted

pytestmark = pytest.mark.triton
pytest.importorskip("triton")

PROBE = '''
import json, os
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl

@triton.jit
def to_bf16(X, Y, N, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(Y + o, tl.load(X + o, mask=o < N).to(tl.bfloat16), mask=o < N)

x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
y = torch.empty(4096, dtype=torch.bfloat16)
to_bf16[(1,)](x, y, 4096, BLOCK=4096)
truncated = (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
print(json.dumps({"nearest": (y == x.to(torch.bfloat16)).float().mean().item(),
                  "truncated": (y == truncated).float().mean().item()}))
'''


def test_the_interpreter_truncates_float32_to_bfloat16() -> None:
    share = run_interpreted(PROBE)
    assert share["truncated"] == 1.0 and share["nearest"] < 0.55, share

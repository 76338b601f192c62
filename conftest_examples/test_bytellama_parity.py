"""The main job: CUDA-captured goldens of a real trained model, replayed on this machine."""
from __future__ import annotations

from typing import Any

import pytest

def test_bytellama_lm(parity: Any, bytellama: Any, heldout_batch: Any) -> None:
    """Per-layer parity (drilled into attention, MLP and norms) plus perplexity, token agreement, KL and
    12 greedy steps, at the deployed precisions. Its float32 rung is a check of its own at block depth
    (below), which keeps the committed goldens small, hence ladder=False here."""
    parity.check_lm(bytellama, heldout_batch, name="bytellama-lm", dtypes=["bfloat16", "float16"], generate=12,
                    drill=1, ladder=False)


def test_bytellama_lm_fp32(parity: Any, bytellama: Any, heldout_batch: Any) -> None:
    """The float32 rung of the ladder, blocks only so the committed file stays under 10 MB.

    Captured on the H200 at block depth; `python -m pytest_rocm_parity.golden.derive` makes the same
    golden from a deeper capture (docs/golden-format.md).
    """
    parity.check_lm(bytellama, heldout_batch, name="bytellama-lm-fp32", dtypes=["float32"], generate=12, drill=0)


@pytest.mark.parity(dtypes=["bfloat16", "float32"])
def test_bytellama_blocks_only(parity: Any, bytellama: Any, heldout_batch: Any) -> None:
    """The plain per-layer check on blocks only (drill=0): what a large model would use."""
    parity.check(bytellama, {"input_ids": heldout_batch, "use_cache": False}, name="bytellama-blocks", drill=0)

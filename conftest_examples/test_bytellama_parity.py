"""The main job: CUDA-captured goldens of a real trained model, replayed on this machine."""
from __future__ import annotations

from typing import Any

import pytest

LADDER = ["float32", "bfloat16", "float16"]


def test_bytellama_lm(parity: Any, bytellama: Any, heldout_batch: Any) -> None:
    """Per-layer parity plus perplexity, token agreement, KL and 12 greedy steps, in every precision."""
    parity.check_lm(bytellama, heldout_batch, name="bytellama-lm", dtypes=LADDER, generate=12, drill=1)


@pytest.mark.parity(dtypes=["bfloat16", "float32"])
def test_bytellama_blocks_only(parity: Any, bytellama: Any, heldout_batch: Any) -> None:
    """The plain per-layer check on blocks only (drill=0): what a large model would use."""
    parity.check(bytellama, {"input_ids": heldout_batch, "use_cache": False}, name="bytellama-blocks", drill=0)

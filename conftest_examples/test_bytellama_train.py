"""Training parity on the example model: one LoRA fine-tuning step (PEFT adapters on the attention's
query and value projections, AdamW), captured on an H200 and judged on this machine."""
from __future__ import annotations

from typing import Any

import pytest


def test_bytellama_lora_step(parity: Any, heldout_batch: Any) -> None:
    """The loss, every module's gradients (the adapters' parameters: the base weights are frozen) and
    the adapters' AdamW update, at bf16 with the float32 rung."""
    peft = pytest.importorskip("peft")
    import torch

    from bytellama import load_bytellama

    torch.manual_seed(0)   # the adapters' initialisation is part of the golden
    model = peft.get_peft_model(load_bytellama(dtype=torch.float32),
                                peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                lora_dropout=0.0))
    with torch.no_grad():   # a trained adapter: B is zero at initialisation, which would give A no gradient
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(1))
    batch = heldout_batch[:, :32]
    parity.check_train(model, {"input_ids": batch, "labels": batch, "use_cache": False}, name="bytellama-lora",
                       dtypes=["bfloat16"], drill=0, optimizer=(torch.optim.AdamW, {"lr": 1e-3}))

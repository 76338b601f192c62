"""On a real GPU: training parity captured and replayed on CUDA (bf16 with the float32 rung); a
backward bug with an exact forward is named."""
from __future__ import annotations

import tempfile
import pytest
import torch

from parity_models import llama, scaled_grad, tokens, wrap_input
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.train import capture_train, replay_train

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")]


def test_training_step_on_cuda_passes_and_a_backward_bug_is_named() -> None:
    t = tokens("none", batch=4, seq=64)
    inputs = {"input_ids": t["input_ids"], "labels": t["input_ids"]}
    spec = CheckSpec(name="train", dtypes=["bfloat16", "float32"], drill=2)
    store = GoldenStore(tempfile.mkdtemp())
    opt = (torch.optim.AdamW, {"lr": 1e-3})
    capture_train(llama("sdpa").cuda(), inputs, spec, store, "cuda", optimizer=opt)
    same = replay_train(llama("sdpa").cuda(), inputs, spec, store, "cuda", optimizer=opt)
    assert all(r.passed for r in same), [(r.dtype, [(l.name, l.reason) for l in r.layers if not l.passed], r.notes)
                                         for r in same]
    model = llama("sdpa").cuda()
    wrap_input(model.model.layers[1].mlp.down_proj, scaled_grad())
    bug = replay_train(model, inputs, spec, store, "cuda", optimizer=opt)
    assert not bug[-1].passed and bug[-1].culprit == "model.layers.1.mlp.down_proj"

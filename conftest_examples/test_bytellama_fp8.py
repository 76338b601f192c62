"""An FP8 checkpoint brought to MI300: the example model quantized to OCP FP8 (e4m3fn, per-channel
weight scales, dynamic per-token activation scales, the lm_head kept unquantized), captured on an
H200 with Hopper's own FP8 GEMM, and replayed where the device computes in FNUZ (MI300) or has no
FP8 at all (this CPU) converted to FNUZ as a MI300 deployment serves it (docs/fp8.md)."""
from __future__ import annotations

import copy
from typing import Any

import pytest


@pytest.fixture
def bytellama_fp8(parity: Any, bytellama: Any) -> Any:
    import torch

    from pytest_rocm_parity import convert_to_fnuz, native_fp8_family, quantize_model

    m = quantize_model(copy.deepcopy(bytellama), "e4m3fn", weight="channel", activation="token")
    dev = torch.device(parity.device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        family = native_fp8_family(props.gcnArchName if torch.version.hip else f"{props.major}.{props.minor}")
    else:
        family = None
    # the checkpoint as the device serves it; without FP8 hardware, the MI300 path is the one to check
    return m if family == "ocp" else convert_to_fnuz(m)


@pytest.mark.parity(dtypes=["bfloat16", "float32"])
def test_bytellama_fp8(parity: Any, bytellama_fp8: Any, heldout_batch: Any) -> None:
    parity.check(bytellama_fp8, {"input_ids": heldout_batch, "use_cache": False}, name="bytellama-fp8", drill=0)

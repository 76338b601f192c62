"""On a real GPU: the migration matrix across SDPA backends and torch.compile(inductor).

Capture with one SDPA backend (the reference's flash attention, say), replay with another (a port
whose flash kernel is missing falls back to the efficient or math kernel); inductor-compiled
candidates; one planted bug. Run on the H200 by scripts/gpu_bench.sh; with PARITY_GPU_RECORD set,
each case's verdict is appended to that JSON-lines file (docs/migrations.md quotes them).
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from parity_models import expected_culprit, llama, plant, tokens, verdicts
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.judging.records import CheckResult
from pytest_rocm_parity.runner.replay import replay

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")]

BACKENDS = ["flash", "efficient", "cudnn", "math"]


@contextlib.contextmanager
def sdpa(name: str) -> Iterator[None]:
    """Only this SDPA backend, with the math kernel where it cannot run (fp32 for flash, masks)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]
    with sdpa_kernel(list(dict.fromkeys([chosen, SDPBackend.MATH]))):
        yield


def _record(case: str, results: list[CheckResult]) -> None:
    path = os.environ.get("PARITY_GPU_RECORD")
    if not path:
        return
    with open(path, "a") as f:
        for r in results:
            worst = max((l.iso.ratio for l in r.layers if l.iso is not None), default=0.0)
            f.write(json.dumps({"case": case, "dtype": r.dtype, "passed": r.passed, "culprit": r.culprit,
                                "worst_isolated_ratio": worst, "device": torch.cuda.get_device_name(),
                                "torch": torch.__version__}) + "\n")


def _model(attn: str = "sdpa") -> torch.nn.Module:
    return llama(attn).to("cuda", torch.bfloat16)


def _run(tmp_path: Any, ref_backend: str, cand: torch.nn.Module, cand_backend: str, pad: str) -> list[CheckResult]:
    spec = CheckSpec(name="m", dtypes=["bfloat16", "float32"])
    store = GoldenStore(tmp_path)
    inputs = tokens(pad, batch=4, seq=64)
    with sdpa(ref_backend):
        capture(_model(), copy.deepcopy(inputs), spec, store, "cuda")
    with sdpa(cand_backend):
        return replay(cand, inputs, spec, store, "cuda")


@pytest.mark.parametrize("pad", ["none", "right"])
@pytest.mark.parametrize("reference, candidate", [(a, b) for a in BACKENDS for b in BACKENDS if a != b])
def test_sdpa_backend_swap_passes(tmp_path: Any, reference: str, candidate: str, pad: str) -> None:
    res = _run(tmp_path, reference, _model(), candidate, pad)
    _record(f"sdpa {reference} -> {candidate}, padding {pad}", res)
    assert all(r.passed for r in res), verdicts(res)


@pytest.mark.parametrize("how", ["whole", "regional"])
def test_inductor_candidate_passes(tmp_path: Any, how: str) -> None:
    cand = _model()
    if how == "whole":
        cand = torch.compile(cand)
    else:
        for layer in cand.model.layers:
            layer.compile()
    res = _run(tmp_path, "flash", cand, "flash", "right")
    _record(f"inductor {how}, flash reference", res)
    assert all(r.passed for r in res), verdicts(res)


def test_eager_attention_candidate_against_flash_passes(tmp_path: Any) -> None:
    res = _run(tmp_path, "flash", _model("eager"), "math", "right")
    _record("eager attention -> flash reference", res)
    assert all(r.passed for r in res), verdicts(res)


def test_a_planted_bug_on_the_gpu_is_named(tmp_path: Any) -> None:
    cand = plant(_model(), "model.layers.1.mlp.down_proj", 1.02)
    res = _run(tmp_path, "flash", cand, "efficient", "right")
    _record("bug in model.layers.1.mlp.down_proj, efficient vs flash", res)
    spec = CheckSpec(name="m", dtypes=["bfloat16", "float32"])
    assert not res[-1].passed and res[-1].culprit == expected_culprit(cand, "model.layers.1.mlp.down_proj", spec), \
        verdicts(res)

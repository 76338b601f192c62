"""How often a correct MoE model fails its bf16 rung when its router's scores carry rounding-size
noise (a GEMM that accumulates in another order): the false-alarm rate of the isolated verdict on
modules that make discrete choices (docs/judging.md, "Confined faults fail" and the near-tie rule).

    python bench/router_noise.py --seeds 12

The migration matrix's MoE language model (tests/parity_models.py: top-2 of 8 experts, 3 blocks),
4 x 64 tokens, captured on the CPU; the candidate is the same model with every router score
multiplied by 1 + r * N(0, 1), r = --relative (2^-9: half a bf16 rounding), one noise seed per
row. Prints one JSON row per seed (verdict, culprit, the failing layers' reasons) and the count.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from parity_models import capture_then_replay, moe_lm, tokens  # noqa: E402
from pytest_rocm_parity.runner.engine import CheckSpec  # noqa: E402


def noisy(model: torch.nn.Module, relative: float, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)

    def noise(_m: torch.nn.Module, _a: Any, out: torch.Tensor) -> torch.Tensor:
        return out * (1 + relative * torch.randn(out.shape, generator=g).to(out.dtype))
    for block in model.blocks:
        block.moe.gate.register_forward_hook(noise)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--relative", type=float, default=2.0**-9)
    args = ap.parse_args()
    torch.set_num_threads(1)
    x = tokens(batch=4, seq=64)["input_ids"]
    passed = 0
    for seed in range(args.seeds):
        res, = capture_then_replay(moe_lm, noisy(moe_lm(), args.relative, seed), x,
                                   CheckSpec(name="m", dtypes=["bfloat16"]))
        passed += res.passed
        print(json.dumps({"seed": seed, "passed": res.passed, "culprit": res.culprit,
                          "failing": {l.name: l.reason for l in res.layers if not l.passed}}))
    print(f"{passed} of {args.seeds} correct-with-noise candidates pass at bfloat16 (relative noise {args.relative:g})")


if __name__ == "__main__":
    main()

"""The FP8 catalogue's table for docs/fp8.md: per case and rung the verdict, the culprit, and the
largest error in units of the activation-quantization noise (alternates) or the culprit's (bugs).

    python bench/fp8_catalogue.py [--dtypes bfloat16,float32]
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "quant")]

import fp8_catalogue as C  # noqa: E402
from parity_models import tokens  # noqa: E402
from pytest_rocm_parity.golden.store import GoldenStore  # noqa: E402
from pytest_rocm_parity.runner.capture import capture  # noqa: E402
from pytest_rocm_parity.runner.engine import CheckSpec  # noqa: E402
from pytest_rocm_parity.runner.replay import replay  # noqa: E402


def noise_ratio(rec: object) -> float:
    m = getattr(rec, "iso", None)
    if m is None or m.noise <= 0:
        return math.nan
    return float(m.err_cand / m.noise)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bfloat16,float32")
    dtypes = ap.parse_args().dtypes.split(",")
    stores = {}
    for wo in (False, True):
        spec = CheckSpec(name=f"fp8-{wo}", dtypes=dtypes, drill=2)
        store = GoldenStore(tempfile.mkdtemp())
        capture(C.reference(wo), tokens("none"), spec, store, "cpu")
        stores[wo] = (store, spec)
    print("| case | rung | verdict | culprit | largest error / noise | note |")
    print("|---|---|---|---|---|---|")
    for case in C.CASES:
        store, spec = stores[case.weight_only]
        for r in replay(C.candidate(case), tokens("none"), spec, store, "cpu"):
            if case.bug:
                rec = next((l for l in r.layers if l.name == r.culprit), None)
                ratio = noise_ratio(rec) if rec is not None else math.nan
            else:
                ratio = max((noise_ratio(l) for l in r.layers if not math.isnan(noise_ratio(l))), default=math.nan)
            note = next((n.split(": ", 1)[1][:70] for n in r.notes if case.module and n.startswith(f"{case.module}:")), "")
            print(f"| {case.id} | {r.dtype} | {'PASS' if r.passed else 'FAIL'} | {r.culprit or ''} | "
                  f"{'' if math.isnan(ratio) else f'{ratio:.3g}'} | {note} |")


if __name__ == "__main__":
    main()

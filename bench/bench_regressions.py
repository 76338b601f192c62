"""Golden pass/fail cost against pytest-regressions' ndarrays_regression, on the same per-layer data.

    pip install pytest-regressions && python bench/bench_regressions.py

Data: 24 layers of (4, 128, 1024) float32 (48 MB), as in docs/calibration.md section 3. Each variant runs
in its own subprocess; reported: wall time of the check itself (imports excluded) and the peak RSS
growth over the process's RSS just before the check. pytest-regressions runs inside pytest (it is a
fixture); ours uses golden.py + compare.py + judge.py directly, as the replay does per layer.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

LAYERS, SHAPE = 24, (4, 128, 1024)

DATA = f'''
import numpy as np
def layers(perturb=False):
    rng = np.random.default_rng(0)
    out = {{}}
    for i in range({LAYERS}):
        a = rng.standard_normal({SHAPE}, dtype=np.float32)
        if perturb and i == 7:
            a = a * np.float32(1.01)
        out[f"layer{{i}}"] = a
    return out
'''

REGRESSIONS_TEST = DATA + '''
import json, os, resource, time
def test_layers(ndarrays_regression):
    data = layers(os.environ.get("PERTURB") == "1")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    err = None
    try:
        ndarrays_regression.check(data, default_tolerance=dict(atol=1e-6, rtol=1e-6))
    except BaseException as exc:  # a failure is what we time in the failing case
        err = exc
    dt = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(os.environ["RESULT"], "w") as f:
        json.dump({"seconds": dt, "rss_growth_mb": (peak - base) / 1024, "failed": err is not None,
                   "message_bytes": len(str(err)) if err else 0}, f)
'''

OURS = DATA + '''
import json, os, resource, sys, time
import torch
from safetensors.torch import save_file
from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.judging.compare import residual_metrics
from pytest_rocm_parity.judging.judge import Rule, judge_layer, finish
from pytest_rocm_parity.judging.records import CheckResult, LayerRecord
from pytest_rocm_parity.judging.tolerance import Tolerance
from pytest_rocm_parity.judging.assertion import message
mode, path = sys.argv[1], sys.argv[2]
if mode == "create":
    ref = {k: torch.from_numpy(v) for k, v in layers().items()}
    t = time.perf_counter()
    tensors = dict(ref)
    tensors.update({f"truth/{k}": torch.zeros(v.shape, dtype=torch.float32) for k, v in ref.items()})
    save_file(tensors, path)
    print(json.dumps({"seconds": time.perf_counter() - t}))
else:
    cand = {k: torch.from_numpy(v) for k, v in layers(mode == "fail").items()}
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    r = RungReader(__import__("pathlib").Path(path), "cpu")
    res = CheckResult(test="bench", name="bench", dtype="float32", passed=True)
    rule = Rule.of(Tolerance(), "float32")
    for k, c in cand.items():
        m = residual_metrics("0", c, r.get(k), r.get(f"truth/{k}"), 2.0**-24)
        rec = LayerRecord(name=k)
        judge_layer(rec, [m], [m], rule)
        res.layers.append(rec)
    finish(res, Tolerance())
    text = message(res) if not res.passed else ""
    dt = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": dt, "rss_growth_mb": (peak - base) / 1024, "failed": not res.passed,
                      "culprit": res.culprit, "message_bytes": len(text)}))
'''


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "test_reg.py").write_text(REGRESSIONS_TEST)
        for case, env in (("create", {}), ("pass", {}), ("fail", {"PERTURB": "1"})):
            res = work / f"{case}.json"
            args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:rocm_parity", "test_reg.py"]
            if case == "create":
                args.append("--force-regen")
            subprocess.run(args, cwd=work, capture_output=True, env={**__import__("os").environ, **env, "RESULT": str(res)})
            out[f"pytest-regressions {case}"] = json.loads(res.read_text())
        (work / "ours.py").write_text(OURS)
        golden = str(work / "golden.safetensors")
        for case in ("create", "pass", "fail"):
            p = subprocess.run([sys.executable, str(work / "ours.py"), case, golden], capture_output=True, text=True, check=True)
            out[f"pytest-rocm-parity {case}"] = json.loads(p.stdout.strip().splitlines()[-1])
    for k, v in out.items():
        print(f"{k:32s} " + "  ".join(f"{a}={b:.3g}" if isinstance(b, float) else f"{a}={b}" for a, b in v.items()))
    reg, ours = out["pytest-regressions pass"]["seconds"], out["pytest-rocm-parity pass"]["seconds"]
    print(f"pass speed-up: {reg / ours:.1f}x; failure peak-RSS ratio: "
          f"{out['pytest-rocm-parity fail']['rss_growth_mb'] / max(out['pytest-regressions fail']['rss_growth_mb'], 1e-9):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

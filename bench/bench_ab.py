"""This tree's replay pass beside an earlier version's, in one process, round by round.

    git archive REV pytest_rocm_parity | tar -x -C ab/old        # an earlier commit's package
    python bench/bench_ab.py --old ab/old/pytest_rocm_parity --device cuda --model 1b --reps 40
    python bench/bench_ab.py --old ab/old/pytest_rocm_parity --device cuda --model 1b --capture --reps 20

Why: a change worth 1% of the pass cannot be seen across processes on a lent H200, where the same
code measured 1.000x and 1.096x the forward in two processes of one run (session 9, run 2). Here
both versions judge the same golden, on the same model, in turn with the plain forward (forward,
old, new, forward, ...), so each round's new/old ratio compares passes a few milliseconds apart.
The old package is copied to a temporary directory under another name (its own imports rewritten),
so both are imported at once, each with its own caches and statistics graphs.

``--capture``: the recording forward instead (capture.recording_pass, as bench_parity.py's
``record_s``: timed until the forward's stream is done, its host copies landing after), each
version's over the plain forward of its round, and the rounds' new/old ratios.

Reported per ``--threads`` value: each version's median pass over the forward, and the median
of the rounds' new/old ratios (``new_over_old``; below 1: this tree is faster). Both versions must
give the same isolated ratios (``same_ratios``).
"""
from __future__ import annotations

import argparse
import importlib
import json
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

OLD_NAME = "prp_old"


def import_renamed(package_dir: str) -> Any:
    """The package at ``package_dir`` imported as OLD_NAME (a copy with its imports rewritten)."""
    src = Path(package_dir)
    if not (src / "__init__.py").is_file():
        raise SystemExit(f"--old {package_dir}: no package there (want the pytest_rocm_parity directory of "
                         f"an export: git archive REV pytest_rocm_parity | tar -x -C DIR)")
    root = Path(tempfile.mkdtemp())
    dst = root / OLD_NAME
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for f in dst.rglob("*.py"):
        f.write_text(re.sub(r"\bpytest_rocm_parity\b", OLD_NAME, f.read_text()))
    sys.path.insert(0, str(root))
    return importlib.import_module(OLD_NAME)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="an earlier version's pytest_rocm_parity directory")
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="1b")
    p.add_argument("--threads", default="1,auto", help="--parity-threads values, comma-separated")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--capture", action="store_true", help="the recording forward, not the replay pass")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import torch

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_parity import build, interleaved, write_rows

    import pytest_rocm_parity as new_pkg
    from pytest_rocm_parity.capture import capture
    from pytest_rocm_parity.engine import CheckSpec, _run
    from pytest_rocm_parity.golden import GoldenStore

    import_renamed(a.old)
    versions = {"old": OLD_NAME, "new": new_pkg.__name__}
    model = build(a.model, a.device)
    if a.capture:
        return _capture_ab(a, model, versions, _run)
    ids = torch.randint(0, model.config.vocab_size, (4, 512), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "use_cache": False}
    store = GoldenStore(tempfile.mkdtemp())
    manifest = capture(model, inputs, CheckSpec(name=a.model, dtypes=["bfloat16"], drill=0, replay="fast"),
                       store, a.device, overwrite=True)
    meta = manifest["rungs"]["bfloat16"]
    path = store.rung_file(a.model, manifest, "bfloat16")
    dev_inputs = {"input_ids": ids.to(a.device), "use_cache": False}
    fns: dict[str, Any] = {"forward": lambda: _run(model, (), dev_inputs)}
    ratios: dict[str, dict[str, float]] = {}
    for threads in a.threads.split(","):
        w = 0 if threads == "auto" else int(threads)
        for tag, pkg in versions.items():
            engine = importlib.import_module(f"{pkg}.engine")
            golden = importlib.import_module(f"{pkg}.golden")
            replay = importlib.import_module(f"{pkg}.replay")
            spec = engine.CheckSpec(name=a.model, dtypes=["bfloat16"], drill=0, replay="fast", threads=w)
            reader = golden.RungReader(path, a.device)
            one = replay.prepare_rung(model, spec, manifest, meta, reader, "bfloat16", a.device,
                                      {"args": (), "kwargs": inputs}, keep_loaded=True)
            res = one()
            assert res.passed, f"{tag} t{threads}: {res.culprit}"
            ratios[f"{tag}_t{threads}"] = {rec.name: rec.iso.ratio for rec in res.layers if rec.iso}
            fns[f"{tag}_t{threads}"] = one
    raw: dict[str, list[float]] = {}
    got = interleaved(fns, a.device, a.reps, raw)
    row: dict[str, Any] = {"model": a.model, "old": a.old, "forward_ms": got["forward"] * 1e3}
    for threads in a.threads.split(","):
        old, new = raw[f"old_t{threads}"], raw[f"new_t{threads}"]
        row[f"t{threads}"] = {
            "old_x": got[f"old_t{threads}"] / got["forward"], "new_x": got[f"new_t{threads}"] / got["forward"],
            "old_x_paired": statistics.median(o / f for o, f in zip(old, raw["forward"])),
            "new_x_paired": statistics.median(n / f for n, f in zip(new, raw["forward"])),
            "new_over_old": statistics.median(n / o for n, o in zip(new, old)),
            "new_faster_rounds": sum(n < o for n, o in zip(new, old)), "rounds": len(new)}
    base = next(iter(ratios.values()))
    row["same_ratios"] = all(abs(r[k] - base[k]) <= 1e-6 * max(1.0, abs(base[k])) for r in ratios.values() for k in base)
    row["raw_ms"] = {k: [round(x * 1e3, 3) for x in v] for k, v in raw.items()}
    print(json.dumps({k: v for k, v in row.items() if k != "raw_ms"}, indent=1), flush=True)
    write_rows(a.out, a.device, [row])
    return 0


def _capture_ab(a: Any, model: Any, versions: dict[str, str], run: Any) -> int:
    """--capture: the recording forward of each version beside the plain forward, round by round."""
    import time

    import torch
    from bench_parity import sync, write_rows

    ids = torch.randint(0, model.config.vocab_size, (4, 512), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids.to(a.device), "use_cache": False}
    fns: dict[str, Any] = {}
    for tag, pkg in versions.items():
        cap = importlib.import_module(f"{pkg}.capture")
        eng = importlib.import_module(f"{pkg}.engine")
        selected = importlib.import_module(f"{pkg}.selection").select(model, None, 0)

        def record(cap: Any = cap, eng: Any = eng, selected: Any = selected) -> float:
            sync(a.device)
            t = time.perf_counter()
            with eng.numerics("bfloat16"):
                rec = cap.recording_pass(model, selected, (), inputs)
            if a.device.startswith("cuda"):
                torch.cuda.current_stream().synchronize()   # the forward's stream; the copies land after
            took = time.perf_counter() - t
            rec.pool.tensors
            if hasattr(rec.pool, "check_repeats"):   # as capture() asks after the forward, where the version does
                rec.pool.check_repeats()
                assert rec.pool.repeats_unchanged()
            return took
        record()
        fns[tag] = record

    def forward() -> float:
        sync(a.device)
        t = time.perf_counter()
        run(model, (), inputs)
        sync(a.device)
        return time.perf_counter() - t
    forward()
    raw: dict[str, list[float]] = {"forward": [], **{k: [] for k in fns}}
    for _ in range(a.reps):
        raw["forward"].append(forward())
        for k, fn in fns.items():
            raw[k].append(fn())
    row: dict[str, Any] = {"model": a.model, "old": a.old, "capture": True,
                           "forward_ms": statistics.median(raw["forward"]) * 1e3}
    for k in fns:
        row[f"{k}_x"] = statistics.median(raw[k]) / statistics.median(raw["forward"])
        row[f"{k}_x_paired"] = statistics.median(x / f for x, f in zip(raw[k], raw["forward"]))
    row["new_over_old"] = statistics.median(n / o for n, o in zip(raw["new"], raw["old"]))
    row["new_faster_rounds"] = sum(n < o for n, o in zip(raw["new"], raw["old"]))
    row["rounds"] = a.reps
    row["raw_ms"] = {k: [round(x * 1e3, 3) for x in v] for k, v in raw.items()}
    print(json.dumps({k: v for k, v in row.items() if k != "raw_ms"}, indent=1), flush=True)
    write_rows(a.out, a.device, [row])
    return 0


if __name__ == "__main__":
    sys.exit(main())

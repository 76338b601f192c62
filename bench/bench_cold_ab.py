"""A cold replay (a new process: hash check, load, passes, verdict) of one golden, by two trees of this
repository in alternation: how a change to the cold path is measured (docs/performance.md).

    python bench/bench_cold_ab.py --base REV              # REV exported with git archive
    python bench/bench_cold_ab.py --base-tree DIR         # a tree exported already (no git there)

Either option may be given several times: every tree then runs in turn with this one.

Each rep also starts a process that runs one plain forward (bench_replay.cold_forward), unless
--no-floor: the floor of a cold replay is reading the golden's bytes plus that first forward, and
the target (docs/performance.md) counts each tree's median over it in warm forwards of the same
process (``over_floor_forwards``).

The golden (a Llama shape, random init, bf16, batch x seq tokens, drill 0, fast replay) is captured
once by this tree; then each rep runs ``replay()`` in a new process with the base tree and with this
one, in turn, sharing one Triton cache folder (filled by a first, unreported round), or with
--fresh-triton-cache each in an empty one (a CI runner that keeps no ``~/.triton``). Prints and
writes (--out) the per-rep times and medians; a difference smaller than the spread of either
tree's reps is noise.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_replay import COLD, cold_forward   # noqa: E402

CAPTURE = """
import sys
sys.path.insert(0, {bench!r})
import torch
from bench_parity import build
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
model = build({name!r}, {device!r})
ids = torch.randint(0, model.config.vocab_size, ({batch}, {seq}), generator=torch.Generator().manual_seed(0))
capture(model, {{"input_ids": ids, "use_cache": False}}, CheckSpec(name={name!r}, dtypes=["bfloat16"], drill=0,
        replay="fast"), GoldenStore({root!r}), {device!r}, overwrite=True)
"""


# appended to each process's script: that its package came from the tree it is timed for
CHECK = """
import os as _os, pytest_rocm_parity as _p
assert _os.path.realpath(_p.__file__).startswith(_os.path.realpath({tree!r}) + _os.sep), _p.__file__
"""


def export(rev: str, into: str) -> str:
    """``rev``'s package and bench folders, written under ``into``."""
    root = HERE.parent
    with tempfile.NamedTemporaryFile(suffix=".tar") as tar:
        subprocess.run(["git", "-C", str(root), "archive", "-o", tar.name, rev, "pytest_rocm_parity", "bench"],
                       check=True)
        with tarfile.open(tar.name) as t:
            t.extractall(into, filter="data")
    return into


def cold(tree: str, name: str, device: str, batch: int, seq: int, root: str, cache: str) -> dict[str, Any]:
    script = COLD.format(bench=os.path.join(tree, "bench"), name=name, device=device, batch=batch, seq=seq,
                         root=root, profile_dir=None)
    env = {**os.environ, "PYTHONPATH": tree, "TRITON_CACHE_DIR": cache}
    # run from the tree: ``python -c`` puts the working directory first on sys.path, ahead of PYTHONPATH
    p = subprocess.run([sys.executable, "-c", script + CHECK.format(tree=tree)], capture_output=True, text=True,
                       env=env, cwd=tree, timeout=600)
    if p.returncode:
        raise SystemExit(f"cold replay with {tree} failed:\n{p.stderr[-2000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def read_s(root: str) -> float:
    """Seconds to read every tensor file under ``root`` (the page cache holds them: they were just
    read or written), as a cold replay must at least."""
    t = time.perf_counter()
    for path in sorted(Path(root).rglob("*.safetensors")):
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", action="append", default=[], help="a commit of this repository to compare against")
    ap.add_argument("--base-tree", action="append", default=[], help="a tree of this repository exported already")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="1b")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--fresh-triton-cache", action="store_true",
                    help="every new process starts with an empty Triton cache folder")
    ap.add_argument("--no-floor", action="store_true", help="leave out the floor's processes (a plain forward each)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not a.base and not a.base_tree:
        ap.error("give --base REV or --base-tree DIR")

    here = str(HERE.parent)
    with tempfile.TemporaryDirectory(prefix="parity-cold-ab-") as work:
        trees = {rev: export(rev, os.path.join(work, f"base-{i}")) for i, rev in enumerate(a.base)}
        trees.update({d: os.path.abspath(d) for d in a.base_tree})
        trees["this"] = here
        root, cache = os.path.join(work, "goldens"), os.path.join(work, "triton-cache")
        os.makedirs(cache)
        subprocess.run([sys.executable, "-c", CAPTURE.format(bench=str(HERE), name=a.model, device=a.device,
                                                             batch=a.batch, seq=a.seq, root=root)],
                       check=True, env={**os.environ, "PYTHONPATH": here})
        for tree in trees.values():   # fills Triton's cache for both; not reported
            cold(tree, a.model, a.device, a.batch, a.seq, root, cache)
        rows: dict[str, list[float]] = {k: [] for k in trees}
        floor: dict[str, list[float]] = {"read_s": [], "cold_forward_s": [], "warm_forward_s": []}
        for rep in range(a.reps):
            if not a.no_floor:
                got = cold_forward(a.model, a.device, a.batch, a.seq, cache)
                if "cold_forward_error" in got:
                    raise SystemExit(f"the floor's forward failed:\n{got['cold_forward_error']}")
                floor["cold_forward_s"].append(got["cold_forward_s"])
                floor["warm_forward_s"].append(got["warm_forward_s"])
                floor["read_s"].append(read_s(root))
            for i, (label, tree) in enumerate(trees.items()):
                if a.fresh_triton_cache:
                    cache = os.path.join(work, f"triton-cache-{rep}-{i}")
                    os.makedirs(cache)
                got = cold(tree, a.model, a.device, a.batch, a.seq, root, cache)
                if not got["passed"]:
                    raise SystemExit(f"the cold replay with {label} failed its check")
                rows[label].append(got["cold_s"])
    out = {"date": time.strftime("%Y-%m-%d"), "model": a.model, "device": a.device,
           "triton_cache": "fresh per process" if a.fresh_triton_cache else "shared, filled",
           "cold_s": rows, "median_s": {k: statistics.median(v) for k, v in rows.items()}}
    if not a.no_floor:
        med = {k: statistics.median(v) for k, v in floor.items()}
        out["floor"] = {**floor, "median_s": med, "floor_s": med["read_s"] + med["cold_forward_s"]}
        out["over_floor_forwards"] = {k: (m - out["floor"]["floor_s"]) / med["warm_forward_s"]
                                      for k, m in out["median_s"].items()}
    print(json.dumps(out))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

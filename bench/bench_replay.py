"""The replay's fast path against the plain forward, each optimisation it keeps against the path it
replaced, and a cold replay in a new process (docs/performance.md).

    python bench/bench_replay.py --device cuda --model 1b --out replay.json

One golden of a Llama shape (random init, bf16, batch x seq tokens, drill 0) is captured, then:

* ``pass_x``: one rung's replay with the goldens on the device, or in memory on a CPU
  (replay._replay_rung: model walk, selection, the fast pass, the verdict) over a plain forward run alongside it. ``pass_again_x`` is
  the same arm measured a second time in the same loop: their difference is this run's noise, the
  yardstick for the gains below.
* ``hooks_x`` / ``swap_x``: what any pass built on module hooks costs before it judges anything:
  the plain forward with the pass's pre- and post-hook on every selected module, doing nothing,
  then with the pre-hook swapping in the golden inputs as the pass does (engine.Hooks,
  replay._swap). The pass's own work is ``pass_x`` over ``swap_x``.
* ``host_ms``: the host's time per pass in each part of it (no wait for the device inside a
  pass: what the host spends issuing it), beside ``forward_issue_ms``, the host's time to issue a
  plain forward. Where a forward is bound by the host, these parts are what the pass adds to it.
  ``forward_syncs`` / ``pass_syncs``: where each makes the host wait for the device (file:line of
  the innermost frame outside torch). ``wall_ms``: the wall-clock time of the pass's parts, each
  ended by a wait for the device (before its forward, its forward, its flush, after it), beside a
  plain forward's: where the pass's time over the forward goes.
* ``full_x`` / ``full_hooked_x``: the full replay (the propagated pass, then the isolated level) with
  each isolated module called directly on its recorded call, and with the isolated level run
  through the teacher-forced forward instead (the model handed in wrapped, as DataParallel, which
  is judged through its own forward).
* ``preload_s`` / ``lazy_s``: a replay of one rung from a fresh reader, the goldens loaded onto the
  device before the pass (replay's preload) or read from the file when a hook needs them.
* ``cold_s``: ``replay()`` in a new process (the hash check, the load, the pass, the verdict): first
  with an empty Triton cache folder, then with that folder filled (``cold_cached_s``; the two differ
  only where the replay reaches the statistics kernel: kernels.kernel_route); ``warm_s`` is a second replay() in that process. ``read_s`` is reading the
  golden's bytes (the page cache holds them: the file was just written), ``hash_s`` the replay's
  check of them (XXH3-128 with xxhash installed), ``hash_sha256_s`` SHA-256's. ``cold_forward_s`` is
  the first plain forward of another new process, and ``cold_floor_s`` that plus ``read_s``: the
  floor of any run that starts a process; that process then times the import of Triton
  (``cold_triton_import_s``, near zero where transformers imported it already:
  ``triton_imported_before``) and its first statistics launch, the kernel in Triton's disk cache
  (``cold_stats_launch_s``). With --profile-dir, a third new process writes a cProfile of its
  replay, by caller, to profiles.txt, beside torch.profiler's tables of a plain forward and of a
  pass (per aten op and device-runtime call, the count and the host time: what a pass adds inside
  torch).

Every timed arm runs in turn with a plain forward (a, b, a, b, ...) and reports the median of --reps.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_parity import SHAPES, _profile, build, interleaved, runtime_profile, sync   # noqa: E402

COLD = """
import json, sys, time
sys.path.insert(0, {bench!r})
import torch
from bench_parity import _profile, build, sync
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.replay import replay
model = build({name!r}, {device!r})
ids = torch.randint(0, model.config.vocab_size, ({batch}, {seq}), generator=torch.Generator().manual_seed(0))
spec = CheckSpec(name={name!r}, dtypes=["bfloat16"], drill=0, replay="fast")
store = GoldenStore({root!r})
out = {{"triton_imported_before": "triton" in sys.modules}}
if {profile_dir!r}:   # the whole first replay under cProfile, by caller: where a cold run's time goes
    _profile(lambda: replay(model, {{"input_ids": ids, "use_cache": False}}, spec, store, {device!r}), {device!r},
             {profile_dir!r}, "cold replay in a new process, Triton's cache filled (cumulative)", "cumulative")
    print(json.dumps(out))
    sys.exit(0)
for k in ("cold_s", "warm_s"):
    sync({device!r}); t = time.perf_counter()
    (res,) = replay(model, {{"input_ids": ids, "use_cache": False}}, spec, store, {device!r})
    sync({device!r}); out[k] = time.perf_counter() - t
    out["passed"] = res.passed
print(json.dumps(out))
"""


COLD_FORWARD = """
import json, sys, time
sys.path.insert(0, {bench!r})
import torch
from bench_parity import build, sync
model = build({name!r}, {device!r})
ids = torch.randint(0, model.config.vocab_size, ({batch}, {seq}), generator=torch.Generator().manual_seed(0))
sync({device!r}); t = time.perf_counter()
with torch.inference_mode():
    model(input_ids=ids.to({device!r}), use_cache=False)
sync({device!r})
out = {{"cold_forward_s": time.perf_counter() - t}}
warm = []
for _ in range(5):   # the same forward once the process is warm: the unit "forwards over the floor" counts in
    t = time.perf_counter()
    with torch.inference_mode():
        model(input_ids=ids.to({device!r}), use_cache=False)
    sync({device!r})
    warm.append(time.perf_counter() - t)
out["warm_forward_s"] = sorted(warm)[2]
if {device!r}.startswith("cuda"):   # what a replay adds to a new process before its statistics: Triton
    t = time.perf_counter()
    import triton
    out["cold_triton_import_s"] = time.perf_counter() - t
    from pytest_rocm_parity.judging.compare import block_layout
    from pytest_rocm_parity.runner import kernels
    x = torch.randn(1 << 20, device={device!r}, dtype=torch.bfloat16)
    t = time.perf_counter()
    kernels.block_stats_many([(x, x, x)], [block_layout(x.numel())]).cpu()
    out["cold_stats_launch_s"] = time.perf_counter() - t   # the kernel from Triton's cache (filled above)
print(json.dumps(out))
"""


def cold_forward(name: str, device: str, batch: int, seq: int, triton_cache: str | None = None) -> dict[str, Any]:
    """The first plain forward of a new process: what any cold run pays before its forwards are warm
    (the device's lazy loading of kernels and libraries), the replay's or not; then on a GPU the
    import of Triton and the first statistics launch from ``triton_cache``."""
    script = COLD_FORWARD.format(bench=str(Path(__file__).resolve().parent), name=name, device=device, batch=batch,
                                 seq=seq)
    env = {**os.environ, **({"TRITON_CACHE_DIR": triton_cache} if triton_cache else {})}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    if p.returncode:
        return {"cold_forward_error": p.stderr[-800:]}
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def cold_replays(name: str, device: str, batch: int, seq: int, root: str, profile_dir: str | None = None
                 ) -> dict[str, Any]:
    """replay() in two new processes sharing one Triton cache folder, empty before the first; with
    ``profile_dir``, a third profiles its replay."""
    def script(profile: str | None) -> str:
        return COLD.format(bench=str(Path(__file__).resolve().parent), name=name, device=device, batch=batch,
                           seq=seq, root=root, profile_dir=profile)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        for label in ("cold", "cold_cached") + (("cold_profile",) if profile_dir else ()):
            p = subprocess.run([sys.executable, "-c", script(profile_dir if label == "cold_profile" else None)],
                               capture_output=True, text=True, env=env, timeout=600)
            if p.returncode:
                out[f"{label}_error"] = p.stderr[-800:]
                continue
            got = json.loads(p.stdout.strip().splitlines()[-1])
            out["triton_imported_before"] = got["triton_imported_before"]
            if label == "cold_profile":
                continue
            out[f"{label}_s"] = got["cold_s"]
            out[f"{label}_passed"] = got["passed"]
            if label == "cold_cached":
                out["warm_s"] = got["warm_s"]
        out.update(cold_forward(name, device, batch, seq, cache))
    return out


def sync_points(fn: Any, device: str) -> list[str]:
    """Where ``fn`` makes the host wait for the device (torch.cuda.set_sync_debug_mode), each as the
    innermost frame outside torch: a wait inside a forward the host bounds costs the pass the
    device's queue."""
    import traceback
    import warnings

    import torch

    if not device.startswith("cuda"):
        return []
    found: list[str] = []
    inside_torch = os.path.dirname(torch.__file__)

    def seen(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if "called a synchronizing" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1]
                  if not f.filename.startswith(inside_torch) and not f.filename.endswith("warnings.py")]
        f = frames[-1]
        found.append(f"{Path(f.filename).name}:{f.lineno} {f.name}")
    sync(device)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = seen
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return found


def host_parts(one_pass: Any, forward: Any, device: str, reps: int) -> dict[str, Any]:
    """The host's milliseconds per pass in each named part of it, each function wrapped by a timer
    for these passes only; parts nest (the hooked forward holds the swap and the output checks, the
    flush its launch and formulas)."""
    import functools
    import statistics

    from pytest_rocm_parity.runner import kernels, replay

    parts = [(replay, "walk_model"), (replay, "Hooks"), (replay, "_run"), (replay, "_swap"),
             (replay._Judge, "leaf"), (replay._Judge, "flush"), (kernels, "block_stats_many"),
             (replay, "metrics_many"), (replay, "judge_layer"), (replay, "finish")]
    spent: dict[str, float] = {}
    saved = [(obj, name, getattr(obj, name)) for obj, name in parts]

    def timer(fn: Any, label: str) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t
        return timed
    issue = []
    try:
        for obj, name, fn in saved:
            setattr(obj, name, timer(fn, f"{obj.__name__.rsplit('.', 1)[-1]}.{name}"))
        for _ in range(reps):
            sync(device)
            t = time.perf_counter()
            forward()
            issue.append(time.perf_counter() - t)
            sync(device)
            one_pass()
            sync(device)
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    return {"forward_issue_ms": statistics.median(issue) * 1e3,
            "host_ms": {k: round(v / reps * 1e3, 3) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}}


def wall_parts(one_pass: Any, forward: Any, device: str, reps: int) -> dict[str, Any]:
    """The wall-clock milliseconds of a pass's parts, each ended by a wait for the device, beside a
    plain forward's (medians of ``reps`` alternations): before its forward (model walk, selection,
    hooks), its hooked forward (``pass_forward_ms`` against ``forward_ms``), its flush (the statistics
    and the formulas) and after it (the model outputs, the verdict). The wait after the forward takes
    away the overlap of the flush's host work with the forward's last kernels, so the parts add up to
    a little more than a pass."""
    import statistics

    from pytest_rocm_parity.runner import replay

    marks: dict[str, float] = {}
    run, flush = replay._run, replay._Judge.flush

    def timed_run(*args: Any, **kwargs: Any) -> Any:
        marks.setdefault("run", time.perf_counter())
        out = run(*args, **kwargs)
        sync(device)
        marks["run_end"] = time.perf_counter()
        return out

    def timed_flush(judge: Any) -> None:
        sync(device)
        t = time.perf_counter()
        flush(judge)
        sync(device)
        marks["flush"] = marks.get("flush", 0.0) + time.perf_counter() - t

    rows: list[dict[str, float]] = []
    replay._run, replay._Judge.flush = timed_run, timed_flush   # type: ignore[method-assign]
    try:
        for _ in range(reps):
            marks.clear()
            sync(device)
            t = time.perf_counter()
            one_pass()
            sync(device)
            end = time.perf_counter()
            row = {"before_forward_ms": marks["run"] - t, "pass_forward_ms": marks["run_end"] - marks["run"],
                   "flush_ms": marks["flush"], "after_ms": end - marks["run_end"] - marks["flush"]}
            sync(device)
            t = time.perf_counter()
            forward()
            sync(device)
            row["forward_ms"] = time.perf_counter() - t
            rows.append(row)
    finally:
        replay._run, replay._Judge.flush = run, flush   # type: ignore[method-assign]
    return {"wall_ms": {k: round(statistics.median(r[k] for r in rows) * 1e3, 3) for k in rows[0]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--lazy-reps", type=int, default=5)
    ap.add_argument("--no-cold", action="store_true", help="leave out the new-process replays")
    ap.add_argument("--profile-dir", default=None, help="write cProfiles of one pass and of a cold replay, and "
                    "torch.profiler's tables of a pass and a plain forward, here (profiles.txt)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch

    from pytest_rocm_parity.golden.reader import RungReader

    from pytest_rocm_parity.golden.store import GoldenStore, digest_matches, expected_digest, file_digests, sha256_file
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.engine import CheckSpec, Hooks, _run
    from pytest_rocm_parity.runner.replay import _preload, _replay_rung, _SharedCopies, _swap, activation_paths
    from pytest_rocm_parity.runner.selection import select

    dev = a.device
    model = build(a.model, dev)
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids.to(dev), "use_cache": False}
    work = tempfile.mkdtemp(prefix="parity-replay-bench-")
    store = GoldenStore(work)
    spec = CheckSpec(name=a.model, dtypes=["bfloat16"], drill=0, replay="fast")
    capture(model, {"input_ids": ids, "use_cache": False}, spec, store, dev, overwrite=True)
    from pytest_rocm_parity.runner import kernels

    kernels.start_kernel()   # the warm arms: a process that judges many passes uses the kernel
    manifest = store.read_manifest(a.model)
    meta = manifest["rungs"]["bfloat16"]
    path = store.rung_file(a.model, manifest, "bfloat16")
    tmpl = {"args": (), "kwargs": {"input_ids": ids, "use_cache": False}}
    row: dict[str, Any] = {"model": a.model, "batch": a.batch, "seq": a.seq, "device": dev,
                           "golden_gb": path.stat().st_size / 1e9}

    def forward() -> None:
        _run(model, (), inputs)

    reader = RungReader(path, dev)
    # every golden the pass reads held in memory, on the CPU too (replay's preload holds a CPU
    # golden only up to replay.CPU_PRELOAD_BYTES): the pass arms measure the pass with its goldens
    # resident, as on a GPU
    reader.preload(sorted(reader.keys), 1 << 62)

    def one_pass() -> Any:
        return _replay_rung(model, spec, meta, reader, "bfloat16", dev, tmpl)

    selected = select(model, spec.layers, spec.drill)
    layers = {e["key"]: e for e in meta["layers"]}
    acts = activation_paths(layers)

    def hooks_only() -> None:
        with Hooks(model, selected, lambda key, sel, a, kw: None, lambda key, sel, out: None):
            forward()

    def golden(key: str, p: str) -> Any:   # a copy, as the pass makes of what the reader holds
        return reader.get(layers[key]["in"][p]).clone()

    shared = _SharedCopies()

    def swapped_in(key: str, sel: Any, a: Any, kw: Any) -> Any:
        if key not in layers:
            return None
        sa, skw, _ = _swap(key, a, kw, acts[key], golden, [], standalone=True, shared=shared)
        return sa, skw

    def swap_only() -> None:
        try:
            with Hooks(model, selected, swapped_in, lambda key, sel, out: None):
                forward()
        finally:
            shared.clear()

    full = CheckSpec(name=a.model, dtypes=["bfloat16"], drill=0, replay="full")
    wrapped = torch.nn.DataParallel(model, device_ids=[torch.device(dev).index or 0]) if dev.startswith("cuda") \
        else torch.nn.DataParallel(model)

    def full_pass() -> Any:
        return _replay_rung(model, full, meta, reader, "bfloat16", dev, tmpl)

    def full_hooked() -> Any:
        return _replay_rung(wrapped, full, meta, reader, "bfloat16", dev, tmpl)

    for _ in range(3):
        forward()
        row["passed"] = one_pass().passed and full_pass().passed and full_hooked().passed
    got = interleaved({"forward": forward, "hooks": hooks_only, "swap": swap_only, "pass": one_pass,
                       "pass_again": one_pass, "full": full_pass, "full_hooked": full_hooked}, dev, a.reps)
    row["forward_s"] = got["forward"]
    for k in ("hooks", "swap", "pass", "pass_again", "full", "full_hooked"):
        row[f"{k}_s"] = got[k]
        row[f"{k}_x"] = got[k] / got["forward"]
    row.update(host_parts(one_pass, forward, dev, a.reps))
    row.update(wall_parts(one_pass, forward, dev, a.reps))
    row["forward_syncs"], row["pass_syncs"] = sync_points(forward, dev), sync_points(one_pass, dev)
    if a.profile_dir:
        os.makedirs(a.profile_dir, exist_ok=True)
        _profile(one_pass, dev, a.profile_dir, f"{a.model} fast pass (replay._replay_rung, goldens loaded)")
        _profile(one_pass, dev, a.profile_dir, f"{a.model} fast pass, by caller", "cumulative")
        runtime_profile({f"{a.model} plain forward": forward, f"{a.model} fast pass": one_pass}, dev, a.profile_dir)
    reader.release()

    def fresh(preload: bool) -> Any:
        def run() -> None:
            r = RungReader(path, dev)
            if preload:
                _preload(r, spec, meta)
            _replay_rung(model, spec, meta, r, "bfloat16", dev, tmpl)
            r.release()
        return run

    got = interleaved({"preload": fresh(True), "lazy": fresh(False)}, dev, a.lazy_reps)
    row["preload_s"], row["lazy_s"] = got["preload"], got["lazy"]

    t = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass
    row["read_s"] = time.perf_counter() - t
    t = time.perf_counter()
    sha256_file(path)
    row["hash_sha256_s"] = time.perf_counter() - t
    t = time.perf_counter()
    file_digests(path)   # SHA-256 and XXH3-128 in one read, as a capture writes them
    row["digests_at_capture_s"] = time.perf_counter() - t
    t = time.perf_counter()
    digest_matches(path, expected_digest(meta))   # what a replay checks (XXH3-128 with xxhash installed)
    row["hash_s"] = time.perf_counter() - t
    if not a.no_cold:
        # the new processes get the GPU's memory to themselves: the wrapper arm holds the model too
        del model, wrapped
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()
        row.update(cold_replays(a.model, dev, a.batch, a.seq, work, a.profile_dir))
        row["floor_s"] = row["read_s"] + row["forward_s"]
        if "cold_cached_s" in row:
            row["cold_cached_over_floor_forwards"] = (row["cold_cached_s"] - row["floor_s"]) / row["forward_s"]
            if "cold_forward_s" in row:   # the floor of a new process: the bytes read and its first forward
                row["cold_floor_s"] = row["read_s"] + row["cold_forward_s"]
                row["cold_cached_over_cold_floor_forwards"] = (row["cold_cached_s"] - row["cold_floor_s"]) / row["forward_s"]
    print(json.dumps(row), flush=True)
    if a.out:
        from pytest_rocm_parity.migration.backend import collect_env

        with open(a.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "env": collect_env(dev), "torch": torch.__version__,
                       "rows": [row]}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

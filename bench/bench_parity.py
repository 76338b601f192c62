"""Capture/replay cost against the plain forward, side by side in one process.

    python bench/bench_parity.py --device cuda --models tiny,1b,8b --out bench-results.json

Models are Llama-architecture, random init, built from configs (no download): `tiny` (4 layers,
hidden 256), `1b` (TinyLlama shape: hidden 2048, 22 layers, GQA 32/4, vocab 32000), `8b`
(Llama-3-8B shape: hidden 4096, 32 layers, GQA 32/8, vocab 128256). Each in bf16, batch x seq
tokens. Reported: plain forward, the recording forward (hooks + host copies), the whole capture
(recording + float64 truth passes + write), replay (propagated + isolated passes + compare),
golden bytes, peak device memory per phase, peak host RSS. The recording forward is timed to the
end of its own work (`record_s`: its host copies still landing, as they do while capture builds the
float64 truth) and to the last copy landed (`record_landed_s`), each rep beside a plain forward.
Replay is timed three ways: cold (hash
check, golden load, Triton's first compile, both passes), warm (a second replay() of the same golden:
load and passes), and per pass with the goldens resident on the device (`pass_full`: propagated +
isolated; `pass_fast`: --parity-replay=fast, the candidate's forward uncompared and the isolated
calls), which is what a loaded golden costs,
interleaved with plain forwards so that each ratio compares runs of the same minute. A pass is one
rung's replay (replay._replay_rung: model walk, selection, the passes and the verdict) with the
goldens preloaded on the device (RungReader.preload).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

SHAPES = {
    # the 1.1B model's module tree at a width where the forward is bound by the host on any machine:
    # a stand-in, measurable on a CPU, for a GPU forward that the host bounds (the 1.1B case on the H200)
    "host": dict(hidden_size=64, intermediate_size=172, num_hidden_layers=22, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
    "tiny": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=512),
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256),
}


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Any, device: str, reps: int) -> float:
    times = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def interleaved(fns: dict[str, Any], device: str, reps: int) -> dict[str, float]:
    """Median time of each function, run in turn (a, b, a, b, ...): the host of a lent GPU machine
    drifts between and within runs, and a ratio of two medians taken minutes apart carries that drift."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def peak_dev(device: str) -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0.0


def reset_dev(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def build(name: str, device: str) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**SHAPES[name], max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return model


class RssSampler:
    """Peak resident memory of this process during a block, sampled every 2 ms from /proc."""

    def __init__(self) -> None:
        import threading

        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def now() -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            self._stop.wait(0.002)

    def __enter__(self) -> RssSampler:
        self.base = self.now()
        self.peak = self.base
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.now())

    @property
    def growth_gib(self) -> float:
        return (self.peak - self.base) / 2**30


def bench_one(name: str, device: str, batch: int, seq: int, reps: int, drill: int, workdir: str,
              sketch: int = 0, profile_dir: str | None = None) -> dict[str, Any]:
    import torch

    from pytest_rocm_parity.runner.capture import capture, recording_pass
    from pytest_rocm_parity.runner.engine import CheckSpec, _run, numerics
    from pytest_rocm_parity.golden.reader import RungReader
    from pytest_rocm_parity.golden.store import GoldenStore
    from pytest_rocm_parity.runner.replay import _replay_rung, replay
    from pytest_rocm_parity.runner.selection import select

    from pytest_rocm_parity.runner import kernels

    kernels.start_kernel()   # a run of many passes: the statistics kernel from the first (kernels.KERNEL_AFTER)
    model = build(name, device)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids.to(device), "use_cache": False}
    row: dict[str, Any] = {"model": name, "params_b": sum(p.numel() for p in model.parameters()) / 1e9,
                           "batch": batch, "seq": seq, "drill": drill, "sketch": sketch}
    with torch.inference_mode():
        for _ in range(2):
            model(**inputs)
    reset_dev(device)
    row["forward_s"] = timed(lambda: _run(model, (), inputs), device, reps)
    row["forward_peak_gib"] = peak_dev(device)
    selected = select(model, None, drill)

    def record() -> None:      # exactly the recording forward of capture(), copies included
        with numerics("bfloat16"):
            rec = recording_pass(model, selected, (), inputs)
        rec.pool.tensors    # waits for the asynchronous copies
        del rec

    checks: list[float] = []    # the comparison of the tensors handed on with their first records

    def record_split() -> tuple[float, float]:
        """(until the recording forward's own work is done, until its host copies have landed)."""
        sync(device)
        t = time.perf_counter()
        with numerics("bfloat16"):
            rec = recording_pass(model, selected, (), inputs)
        if device.startswith("cuda"):
            torch.cuda.current_stream().synchronize()   # the forward's stream; the copy stream runs on
        t1 = time.perf_counter()
        rec.pool.tensors
        t2 = time.perf_counter()
        rec.pool.check_repeats()              # as capture() does after the recording forward
        assert rec.pool.repeats_unchanged()   # this model writes nothing it hands on: one recording
        checks.append(time.perf_counter() - t2)
        del rec
        return t1 - t, t2 - t

    record()
    reset_dev(device)
    fwd, own, landed = [], [], []
    for _ in range(reps):    # interleaved with the plain forward
        fwd.append(timed(lambda: _run(model, (), inputs), device, 1))
        a, b = record_split()
        own.append(a)
        landed.append(b)
    row["record_forward_s"] = statistics.median(fwd)
    row["record_s"] = statistics.median(own)           # what the capture's forward costs: copies in flight
    row["record_landed_s"] = statistics.median(landed)  # ... until every copy is on the host
    row["record_x"] = row["record_s"] / row["record_forward_s"]
    row["record_landed_x"] = row["record_landed_s"] / row["record_forward_s"]
    row["repeat_check_s"] = statistics.median(checks)
    row["record_peak_gib"] = peak_dev(device)
    if profile_dir:
        _profile(record, device, profile_dir, f"{name} recording pass")
    if device.startswith("cuda"):   # the floor of the recording: device-to-host bandwidth into pinned memory
        src = torch.empty(256 << 20, dtype=torch.uint8, device=device)
        dst = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
        row["d2h_pinned_gbps"] = (256 << 20) / timed(lambda: dst.copy_(src, non_blocking=True), device, 5) / 1e9
        del src, dst
    store = GoldenStore(os.path.join(workdir, name))
    spec = CheckSpec(name=name, dtypes=["bfloat16"], drill=drill, sketch=sketch)
    reset_dev(device)
    with RssSampler() as rss:
        t = time.perf_counter()
        capture(model, {"input_ids": ids, "use_cache": False}, spec, store, device, overwrite=True)
        sync(device)
        row["capture_s"] = time.perf_counter() - t
    row["capture_host_growth_gib"] = rss.growth_gib
    row["capture_peak_gib"] = peak_dev(device)
    gdir = store.dir_for(name)
    row["golden_gb"] = sum(p.stat().st_size for p in gdir.iterdir()) / 1e9
    reset_dev(device)
    t = time.perf_counter()
    (res,) = replay(model, {"input_ids": ids, "use_cache": False}, spec, store, device)
    sync(device)
    row["replay_cold_s"] = time.perf_counter() - t   # hash, load, Triton compile (first use), passes
    row["replay_peak_gib"] = peak_dev(device)
    row["replay_passed"] = res.passed
    row["layers"] = len(res.layers)
    t = time.perf_counter()
    (res,) = replay(model, {"input_ids": ids, "use_cache": False}, spec, store, device)
    sync(device)
    row["replay_warm_s"] = time.perf_counter() - t   # hash verified, kernel compiled: load + passes
    if not sketch:
        # The passes with the goldens resident on the device: what a replay costs once loaded.
        manifest = store.read_manifest(name)
        meta = manifest["rungs"]["bfloat16"]
        reader = RungReader(store.rung_file(name, manifest, "bfloat16"), str(device))
        tmpl = {"args": (), "kwargs": {"input_ids": ids, "use_cache": False}}
        for kind in ("full", "fast"):
            sp = CheckSpec(name=name, dtypes=["bfloat16"], drill=drill, replay=kind)

            def one_pass() -> Any:
                return _replay_rung(model, sp, meta, reader, "bfloat16", device, tmpl)

            t = time.perf_counter()
            if kind == "full":
                reader.preload(list(reader.keys), 1 << 62)
            r = one_pass()
            sync(device)
            if kind == "full":
                row["load_s"] = time.perf_counter() - t   # the goldens to the device and a first full pass
            row[f"{kind}_passed"] = r.passed
            got = interleaved({"forward": lambda: _run(model, (), inputs), "pass": one_pass}, device, reps)
            row[f"pass_{kind}_s"], row[f"pass_{kind}_forward_s"] = got["pass"], got["forward"]
            row[f"pass_{kind}_x"] = got["pass"] / got["forward"]   # against the forward run alongside
            if profile_dir:   # where the host time of a pass goes (what the GPU cannot hide)
                _profile(one_pass, device, profile_dir, f"{name} {kind} pass")
            if profile_dir and kind == "fast" and device.startswith("cuda"):   # and the device time
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    one_pass()
                    sync(device)
                with open(os.path.join(profile_dir, "profiles.txt"), "a") as f:
                    f.write(f"===== {name} fast pass: device time =====\n")
                    f.write(prof.key_averages().table(sort_by="self_device_time_total", row_limit=18))
                    f.write("\n")
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    _run(model, (), inputs)
                    sync(device)
                with open(os.path.join(profile_dir, "profiles.txt"), "a") as f:
                    f.write(f"===== {name} plain forward: device time =====\n")
                    f.write(prof.key_averages().table(sort_by="self_device_time_total", row_limit=10))
                    f.write("\n")
        reader.release()
    row["host_peak_rss_gib"] = rss_gb()
    for k in ("capture_s", "replay_cold_s", "replay_warm_s"):
        if k in row:
            row[k[:-2] + "_x"] = row[k] / row["forward_s"]
    shutil.rmtree(gdir, ignore_errors=True)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return row


def _profile(fn: Any, device: str, profile_dir: str, title: str, sort: str = "tottime") -> None:
    """cProfile of one call, appended to profile_dir/profiles.txt (tottime order: host time by
    function; cumulative: by caller, which shows the phases of a cold run)."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    fn()
    sync(device)
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats(sort).print_stats(30 if sort == "tottime" else 60)
    with open(os.path.join(profile_dir, "profiles.txt"), "a") as f:
        f.write(f"===== {title} =====\n{_portable(buf.getvalue())}")


def runtime_profile(fns: dict[str, Any], device: str, profile_dir: str, reps: int = 5) -> None:
    """torch.profiler's host-side table of each of ``fns`` (``reps`` calls after one unprofiled),
    appended to profile_dir/profiles.txt: per aten op and per device-runtime call (kernel launches,
    allocations, event waits) the count and the host time, which a cProfile cannot see inside
    torch. Side by side, a pass's table against the plain forward's says what the pass adds."""
    import torch

    for label, fn in fns.items():
        fn()
        sync(device)
        acts = [torch.profiler.ProfilerActivity.CPU]
        if device.startswith("cuda"):   # the runtime's calls (launches, allocations) and the kernels
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(reps):
                fn()
                sync(device)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60)
        with open(os.path.join(profile_dir, "profiles.txt"), "a") as f:
            f.write(f"===== {label}: torch.profiler, host time per op, {reps} calls =====\n{table}\n")


def _portable(text: str) -> str:
    """File names relative to the repository or to site-packages: the profile is read elsewhere."""
    import re
    import site

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    text = text.replace(root, "")
    for sp in site.getsitepackages() + [site.getusersitepackages()]:
        text = text.replace(sp.rstrip(os.sep) + os.sep, "site-packages/")
    return re.sub(r"\S*/site-packages/", "site-packages/", text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--models", default="tiny")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--drill", type=int, default=0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--sketch", type=int, default=0, help="sketch goldens with this group size (0: full)")
    p.add_argument("--out", default=None)
    p.add_argument("--profile-dir", default=None, help="write a cProfile of one replay pass per model here")
    a = p.parse_args(argv)
    work = a.workdir or tempfile.mkdtemp(prefix="parity-bench-")
    rows = []
    for name in a.models.split(","):
        try:
            rows.append(bench_one(name, a.device, a.batch, a.seq, a.reps, a.drill, work, a.sketch, a.profile_dir))
        except Exception as exc:  # report and go on: one OOM must not lose the other rows
            rows.append({"model": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
        print(json.dumps(rows[-1]), flush=True)
    write_rows(a.out, a.device, rows)
    return 0


def write_rows(path: str | None, device: str, rows: list[dict[str, Any]]) -> None:
    """The run's rows with its date and environment, as JSON at ``path``."""
    import torch

    from pytest_rocm_parity.migration.backend import collect_env

    if path:
        doc = {"date": time.strftime("%Y-%m-%d"), "env": collect_env(device), "torch": torch.__version__, "rows": rows}
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())

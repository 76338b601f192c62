"""Capture/replay cost against the plain forward, side by side in one process.

    python bench/bench_parity.py --device cuda --models tiny,1b,8b --out bench-results.json

Models are Llama-architecture, random init, built from configs (no download): `tiny` (4 layers,
hidden 256), `1b` (TinyLlama shape: hidden 2048, 22 layers, GQA 32/4, vocab 32000), `8b`
(Llama-3-8B shape: hidden 4096, 32 layers, GQA 32/8, vocab 128256). Each in bf16, batch x seq
tokens. Reported: plain forward, the recording forward (hooks + host copies), the whole capture
(recording + float64 truth passes + write), replay (propagated + isolated passes + compare),
golden bytes, peak device memory per phase, peak host RSS.
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


def bench_one(name: str, device: str, batch: int, seq: int, reps: int, drill: int, workdir: str,
              sketch: int = 0) -> dict[str, Any]:
    import torch

    from pytest_rocm_parity.capture import _Pool, capture

    from pytest_rocm_parity.engine import CheckSpec, Hooks, _run

    from pytest_rocm_parity.replay import replay
    from pytest_rocm_parity.golden import GoldenStore
    from pytest_rocm_parity.selection import select

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

    def record() -> None:
        pool = _Pool()
        with Hooks(model, selected, lambda k, s, a, kw: [pool.add(t) for t in _leaves(a, kw)] and None,
                   lambda k, s, o: [pool.add(t) for t in _leaves(o)] and None):
            _run(model, (), inputs)
        pool.release()

    reset_dev(device)
    row["record_s"] = timed(record, device, max(1, reps // 2))
    row["record_peak_gib"] = peak_dev(device)
    store = GoldenStore(os.path.join(workdir, name))
    spec = CheckSpec(name=name, dtypes=["bfloat16"], drill=drill, sketch=sketch)
    reset_dev(device)
    t = time.perf_counter()
    capture(model, {"input_ids": ids, "use_cache": False}, spec, store, device, overwrite=True)
    sync(device)
    row["capture_s"] = time.perf_counter() - t
    row["capture_peak_gib"] = peak_dev(device)
    gdir = store.dir_for(name)
    row["golden_gb"] = sum(p.stat().st_size for p in gdir.iterdir()) / 1e9
    reset_dev(device)
    t = time.perf_counter()
    (res,) = replay(model, {"input_ids": ids, "use_cache": False}, spec, store, device)
    sync(device)
    row["replay_s"] = time.perf_counter() - t
    row["replay_peak_gib"] = peak_dev(device)
    row["replay_passed"] = res.passed
    row["layers"] = len(res.layers)
    row["host_peak_rss_gib"] = rss_gb()
    for k in ("record_s", "capture_s", "replay_s"):
        row[k.replace("_s", "_x")] = row[k] / row["forward_s"]
    shutil.rmtree(gdir, ignore_errors=True)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return row


def _leaves(*objs: Any) -> list[Any]:
    from pytest_rocm_parity.tree import tensor_leaves

    return [t for o in objs for t in tensor_leaves(o).values()]


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
    a = p.parse_args(argv)
    import torch

    from pytest_rocm_parity.backend import collect_env

    work = a.workdir or tempfile.mkdtemp(prefix="parity-bench-")
    rows = []
    for name in a.models.split(","):
        try:
            rows.append(bench_one(name, a.device, a.batch, a.seq, a.reps, a.drill, work, a.sketch))
        except Exception as exc:  # report and go on: one OOM must not lose the other rows
            rows.append({"model": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
        print(json.dumps(rows[-1]), flush=True)
    doc = {"date": time.strftime("%Y-%m-%d"), "env": collect_env(a.device), "torch": torch.__version__, "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

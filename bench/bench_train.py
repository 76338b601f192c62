"""check_train's cost against a plain training step (docs/performance.md).

    python bench/bench_train.py --device cuda --model 1b --batch 2 --seq 512

A Llama of the TinyLlama shape (random init, bf16), its own loss on labels = inputs, one AdamW step.
Reported: a plain training step (forward, backward, optimizer step; median of --reps), the capture of
the training golden (reference step, float64 step, isolated backwards, optimizer steps, write), a
replay of it (two backward runs, isolated backwards, optimizer step, verdict), the golden's size and
the device's peak memory of each.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_parity import SHAPES   # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--drill", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pytest_rocm_parity import CheckSpec, GoldenStore, capture_train, replay_train

    def sync() -> None:
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()

    def peak_reset() -> None:
        if a.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()

    def peak() -> float:
        return torch.cuda.max_memory_allocated() / 2**30 if a.device.startswith("cuda") else 0.0

    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPES[a.model], max_position_embeddings=max(2048, a.seq), use_cache=False)
    model = LlamaForCausalLM(cfg).to(a.device, torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "labels": ids, "use_cache": False}
    opt = (torch.optim.AdamW, {"lr": 1e-4})

    def plain_step() -> None:
        m = model
        o = torch.optim.AdamW(m.parameters(), lr=1e-4)
        out = m(input_ids=ids.to(a.device), labels=ids.to(a.device), use_cache=False)
        out.loss.backward()
        o.step()
        o.zero_grad(set_to_none=True)

    import copy

    base = copy.deepcopy(model.state_dict())
    times = []
    peak_reset()
    for _ in range(a.reps + 1):
        sync()
        t = time.perf_counter()
        plain_step()
        sync()
        times.append(time.perf_counter() - t)
    step_peak = peak()
    model.load_state_dict(base)
    row: dict[str, object] = {"model": a.model, "batch": a.batch, "seq": a.seq, "drill": a.drill,
                              "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
                              "torch": torch.__version__, "step_s": statistics.median(times[1:]),
                              "step_peak_gib": step_peak}
    store = GoldenStore(tempfile.mkdtemp())
    spec = CheckSpec(name="train", dtypes=["bfloat16"], drill=a.drill)
    peak_reset()
    sync()
    t = time.perf_counter()
    capture_train(model, inputs, spec, store, a.device, optimizer=opt)
    sync()
    row["capture_s"], row["capture_peak_gib"] = time.perf_counter() - t, peak()
    row["golden_gb"] = sum(p.stat().st_size for p in Path(store.root).rglob("*.safetensors")) / 1e9
    peak_reset()
    t = time.perf_counter()
    (res,) = replay_train(model, inputs, spec, store, a.device, optimizer=opt)
    sync()
    row["replay_s"], row["replay_peak_gib"], row["replay_passed"] = time.perf_counter() - t, peak(), res.passed
    row["capture_x"] = row["capture_s"] / row["step_s"]   # type: ignore[operator]
    row["replay_x"] = row["replay_s"] / row["step_s"]     # type: ignore[operator]
    print(json.dumps(row))
    if a.out:
        Path(a.out).write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

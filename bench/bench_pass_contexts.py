"""What a replay pass pays to enter eval mode and its numerics settings, right after a forward.

    python bench/bench_pass_contexts.py [--layers 22] [--reps 300] [--out contexts.json]

Why: each pass enters engine.eval_mode and engine.numerics. Timed alone in a loop they look free
(the modules are in the host's caches); inside a pass they come right after the model's forward,
which has evicted them. This times each step after a forward of a Llama of the 1.1B model's depth
(16-wide layers, 4 tokens: the same module tree, negligible compute), on the CPU: ``look`` (the
per-module training-flag check eval_mode made before session 8), ``walk_flag`` (what it does
now with the set-up's walk: reads ModelWalk.training), numerics' enter and exit on an fp32 rung
(the only rung that touches the TF32 flags since session 8), and ``flags_read_restore``: reading
and restoring those flags, which every other rung did before. Medians, microseconds.
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_parity import thin_args, thin_llama, write_rows

    a = thin_args(__doc__ or "", argv)
    import torch

    from pytest_rocm_parity.engine import _TRAINING, eval_mode, numerics, walk_model

    model, ids = thin_llama(a.layers)
    walk = walk_model(model)

    def forward() -> None:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)

    samples: dict[str, list[float]] = {"look": [], "walk_flag": [], "numerics_fp32_enter": [],
                                       "numerics_fp32_exit": [], "flags_read_restore": []}
    cmm, cdn = torch.backends.cuda.matmul, torch.backends.cudnn
    for _ in range(a.reps):
        forward()
        t = time.perf_counter()
        any(map(_TRAINING, walk.modules))
        samples["look"].append(time.perf_counter() - t)
        forward()
        t = time.perf_counter()
        with eval_mode(model, walk):
            samples["walk_flag"].append(time.perf_counter() - t)
        forward()
        cm: Any = numerics("float32", False)
        t = time.perf_counter()
        cm.__enter__()
        samples["numerics_fp32_enter"].append(time.perf_counter() - t)
        forward()
        t = time.perf_counter()
        cm.__exit__(None, None, None)
        samples["numerics_fp32_exit"].append(time.perf_counter() - t)
        forward()
        t = time.perf_counter()
        old = (cmm.allow_tf32, cdn.allow_tf32)     # what every other rung did before session 8
        cmm.allow_tf32, cdn.allow_tf32 = old
        samples["flags_read_restore"].append(time.perf_counter() - t)
    row = {"model": f"llama-16wide-{a.layers}", "modules": len(walk.modules),
           **{f"{k}_us": statistics.median(v) * 1e6 for k, v in samples.items()}}
    print(row, flush=True)
    write_rows(a.out, "cpu", [row])
    return 0


if __name__ == "__main__":
    sys.exit(main())

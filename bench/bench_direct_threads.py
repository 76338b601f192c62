"""A fast replay pass with its direct calls shared by 1..N host threads, beside the plain forward.

    python bench/bench_direct_threads.py --device cuda --models 1b,8b --workers 1,2,3,4 --out threads.json
    python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --launch-mb 0,32,128
    python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --host-pointers on,off

``--launch-mb``: arms with replay._StatsQueue.LAUNCH_BYTES set (MiB of candidate outputs that start
a part of the statistics during the pass; 0: every statistic at the flush, as before session 6).

Each isolated call takes golden inputs, so a level's calls are independent; direct.run_level runs
shares of them on host threads with a CUDA stream each (--parity-threads, CheckSpec.threads). This
measures what that buys on a forward bound by the host (1.1B at 4x512 on an H200) and on one bound
by the device (8B), and checks that every worker count gives the same isolated ratios as one thread.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--models", default="1b")
    p.add_argument("--workers", default="1,2,3,4", help="thread counts, comma-separated; auto for the choice")
    p.add_argument("--columns-kernel", default="", help="on,off: arms with stats_graph.COLUMNS_KERNEL set")
    p.add_argument("--aligned-loads", default="", help="on,off: arms with kernels.ALIGNED_LOADS set")
    p.add_argument("--host-pointers", default="", help="on,off: arms with kernels.HOST_POINTERS set")
    p.add_argument("--launch-mb", default="", help="LAUNCH_BYTES arms in MiB, comma-separated; default: the code's")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import torch

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_parity import build, interleaved, write_rows

    from pytest_rocm_parity.capture import capture
    from pytest_rocm_parity.engine import CheckSpec, _run
    from pytest_rocm_parity.golden import GoldenStore, RungReader
    from pytest_rocm_parity import direct, kernels, stats_graph
    from pytest_rocm_parity.replay import _StatsQueue, prepare_rung

    rows: list[dict[str, Any]] = []
    for name in a.models.split(","):
        model = build(name, a.device)
        ids = torch.randint(0, model.config.vocab_size, (4, 512), generator=torch.Generator().manual_seed(0))
        inputs = {"input_ids": ids, "use_cache": False}
        dev_inputs = {"input_ids": ids.to(a.device), "use_cache": False}
        store = GoldenStore(tempfile.mkdtemp())
        spec = CheckSpec(name=name, dtypes=["bfloat16"], drill=0, replay="fast")
        manifest = capture(model, inputs, spec, store, a.device, overwrite=True)
        meta = manifest["rungs"]["bfloat16"]
        reader = RungReader(store.rung_file(name, manifest, "bfloat16"), a.device)
        ratios: dict[int, dict[str, float]] = {}
        fns: dict[str, Any] = {"forward": lambda m=model: _run(m, (), dev_inputs)}
        default = _StatsQueue.LAUNCH_BYTES
        launches = [int(float(x) * (1 << 20)) for x in a.launch_mb.split(",")] if a.launch_mb else [default]
        kdefault = stats_graph.COLUMNS_KERNEL
        kernels_on = [x == "on" for x in a.columns_kernel.split(",")] if a.columns_kernel else [kdefault]
        adefault = kernels.ALIGNED_LOADS
        aligned_on = [x == "on" for x in a.aligned_loads.split(",")] if a.aligned_loads else [adefault]
        hdefault = kernels.HOST_POINTERS
        host_on = [x == "on" for x in a.host_pointers.split(",")] if a.host_pointers else [hdefault]
        for w in [0 if x == "auto" else int(x) for x in a.workers.split(",")]:   # 0: --parity-threads=auto
            for lb, kon, aon, hon in itertools.product(launches, kernels_on, aligned_on, host_on):
                sp = CheckSpec(name=name, dtypes=["bfloat16"], drill=0, replay="fast", threads=w)
                one = prepare_rung(model, sp, manifest, meta, reader, "bfloat16", a.device,
                                   {"args": (), "kwargs": inputs}, keep_loaded=True)

                def arm(one: Any = one, lb: int = lb, kon: bool = kon, aon: bool = aon, hon: bool = hon,
                        default: int = default, kdefault: bool = kdefault, adefault: bool = adefault,
                        hdefault: bool = hdefault) -> Any:
                    (_StatsQueue.LAUNCH_BYTES, stats_graph.COLUMNS_KERNEL, kernels.ALIGNED_LOADS,
                     kernels.HOST_POINTERS) = lb, kon, aon, hon
                    try:
                        return one()
                    finally:
                        (_StatsQueue.LAUNCH_BYTES, stats_graph.COLUMNS_KERNEL, kernels.ALIGNED_LOADS,
                         kernels.HOST_POINTERS) = default, kdefault, adefault, hdefault
                res = arm()
                ratios[(w, lb, kon, aon, hon)] = {l.name: l.iso.ratio for l in res.layers if l.iso}
                fns[f"pass_w{w}" + (f"_l{lb >> 20}" if len(launches) > 1 else "")
                    + (f"_k{'on' if kon else 'off'}" if len(kernels_on) > 1 else "")
                    + (f"_a{'on' if aon else 'off'}" if len(aligned_on) > 1 else "")
                    + (f"_h{'on' if hon else 'off'}" if len(host_on) > 1 else "")] = arm
        got = interleaved(fns, a.device, a.reps)
        row: dict[str, Any] = {"model": name, **{f"{k}_ms": v * 1e3 for k, v in got.items()}}
        for k, v in got.items():
            if k != "forward":
                row[f"{k}_x"] = v / got["forward"]
        base = ratios[min(ratios)]
        row["same_ratios"] = {f"w{w}_l{lb >> 20}_k{int(kon)}_a{int(aon)}_h{int(hon)}":
                              all(abs(r[k] - base[k]) <= 1e-6 * max(1.0, abs(base[k])) for k in base)
                              for (w, lb, kon, aon, hon), r in ratios.items()}
        row["columns_errors"] = stats_graph.COLUMNS_ERRORS
        row["host_pointer_errors"] = kernels.HOST_POINTER_ERRORS
        row["capture_errors"] = stats_graph.CAPTURE_ERRORS
        # what --parity-threads=auto measured (seconds per call, per arm) and how often it chose
        row["auto_samples"] = {str(k): {arm: [round(x * 1e6, 2) for x in v] for arm, v in s.items()}
                               for k, s in direct.CHOOSER.samples.items()}
        row["auto_picks"] = {str(k): v for k, v in direct.CHOOSER.picks.items()}
        row["launch_bytes_default"] = default
        rows.append(row)
        print(json.dumps(row), flush=True)
        reader.release()
        del model, one
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
    write_rows(a.out, a.device, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

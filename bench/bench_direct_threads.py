"""A fast replay pass with its direct calls shared by 1..N host threads, beside the plain forward.

    python bench/bench_direct_threads.py --device cuda --models 1b,8b --workers 1,2,3,4 --out threads.json
    python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --launch-mb 0,32,128
    python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --host-pointers on,off
    python bench/bench_direct_threads.py --device cuda --models 1b --workers 1 --launch-mb 0,128,256 --side-stream on,off
    python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --blocks-last on,off --bare
    python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --part-before-blocks on,off --bare
    python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --slots on,off --restarts on,off --bare
    python bench/bench_direct_threads.py --device cuda --models 1b --workers 1 --keep-inputs on,off --bare

``--launch-mb``: arms with replay._StatsQueue.LAUNCH_BYTES set (MiB of candidate outputs that start
a part of the statistics during the pass; 0: every statistic at the flush, as before session 6);
``--side-stream``: those parts on a side stream beside the calls, or on the main stream after them.
``--blocks-last``: direct.BLOCKS_LAST on and off (the repeated blocks' calls after the others, or
every call in the model's order). ``--part-before-blocks``: replay._StatsQueue.PART_BEFORE_BLOCKS
on and off (the statistics of the calls before the repeated blocks started beside them, or all at
the flush). ``--slots``: replay.SLOTS on and off (a direct call's output queued through the slot
made from its first, or by the general comparison); ``--restarts``: replay._StatsQueue.RESTARTS
(a graphed run of slotted outputs started again through its stats_graph.Restart, or by
stats_graph.start); ``--defer-slots``: replay.DEFER_SLOTS (a level's slotted outputs queued
together after its calls, or each as its call returns); ``--keep-inputs``: replay.KEEP_INPUTS (a level's calls given the inputs
kept from the pass before, or fetched every pass). ``--bare``: one more arm, the level's modules called on their
golden inputs by a plain loop in the model's order, nothing judged: the floor of a pass's calls,
so pass - bare is what the harness costs on this host. Each arm's ``_xp``: the median over
rounds of its time over the forward's in the same round (steadier than a ratio of medians where
the host's speed drifts).

Each isolated call takes golden inputs, so a level's calls are independent; direct.run_level runs
shares of them on host threads with a CUDA stream each (--parity-threads, CheckSpec.threads). This
measures what that buys on a forward bound by the host (1.1B at 4x512 on an H200) and on one bound
by the device (8B), and checks that every worker count gives the same isolated ratios as one thread.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--models", default="1b")
    p.add_argument("--workers", default="1,2,3,4", help="thread counts, comma-separated; auto for the choice")
    p.add_argument("--columns-kernel", default="", help="on,off: arms with stats_graph.COLUMNS_KERNEL set")
    p.add_argument("--aligned-loads", default="", help="on,off: arms with kernels.ALIGNED_LOADS set")
    p.add_argument("--host-pointers", default="", help="on,off: arms with kernels.HOST_POINTERS set")
    p.add_argument("--side-stream", default="", help="on,off: arms with replay._StatsQueue.SIDE_STREAM set")
    p.add_argument("--launch-mb", default="", help="LAUNCH_BYTES arms in MiB, comma-separated; default: the code's")
    p.add_argument("--blocks-last", default="", help="on,off: arms with direct.BLOCKS_LAST set")
    p.add_argument("--part-before-blocks", default="",
                   help="on,off: arms with replay._StatsQueue.PART_BEFORE_BLOCKS set")
    p.add_argument("--slots", default="", help="on,off: arms with replay.SLOTS set")
    p.add_argument("--defer-slots", default="", help="on,off: arms with replay.DEFER_SLOTS set")
    p.add_argument("--restarts", default="", help="on,off: arms with replay._StatsQueue.RESTARTS set")
    p.add_argument("--keep-inputs", default="", help="on,off: arms with replay.KEEP_INPUTS set")
    p.add_argument("--bare", action="store_true", help="an arm of the modules alone on their golden inputs")
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
    from pytest_rocm_parity import replay as replay_mod
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
        ratios: dict[tuple[Any, ...], dict[str, float]] = {}
        allocs: dict[str, list[int]] = {}   # per pass: new device allocations by the caching allocator
        fns: dict[str, Any] = {"forward": lambda m=model: _run(m, (), dev_inputs)}
        # the arms: each knob's values (its default alone unless asked), every combination
        knobs = [("l", _StatsQueue, "LAUNCH_BYTES", [int(float(x) * (1 << 20)) for x in a.launch_mb.split(",")]
                  if a.launch_mb else None),
                 ("s", _StatsQueue, "SIDE_STREAM", a.side_stream),
                 ("k", stats_graph, "COLUMNS_KERNEL", a.columns_kernel),
                 ("a", kernels, "ALIGNED_LOADS", a.aligned_loads),
                 ("h", kernels, "HOST_POINTERS", a.host_pointers),
                 ("b", direct, "BLOCKS_LAST", a.blocks_last),
                 ("p", _StatsQueue, "PART_BEFORE_BLOCKS", a.part_before_blocks),
                 ("o", replay_mod, "SLOTS", a.slots),
                 ("d", replay_mod, "DEFER_SLOTS", a.defer_slots),
                 ("r", _StatsQueue, "RESTARTS", a.restarts),
                 ("i", replay_mod, "KEEP_INPUTS", a.keep_inputs)]
        values = [v if isinstance(v, list) else [x == "on" for x in v.split(",")] if v else [getattr(o, at)]
                  for _, o, at, v in knobs]
        defaults = [getattr(o, at) for _, o, at, _v in knobs]
        for w in [0 if x == "auto" else int(x) for x in a.workers.split(",")]:   # 0: --parity-threads=auto
            for combo in itertools.product(*values):
                sp = CheckSpec(name=name, dtypes=["bfloat16"], drill=0, replay="fast", threads=w)
                one = prepare_rung(model, sp, manifest, meta, reader, "bfloat16", a.device,
                                   {"args": (), "kwargs": inputs}, keep_loaded=True)

                label = f"pass_w{w}" + "".join(_label(tag, x) for (tag, *_), vs, x in zip(knobs, values, combo)
                                               if len(vs) > 1)

                def arm(one: Any = one, combo: tuple[Any, ...] = combo) -> Any:
                    for (_, o, at, _v), x in zip(knobs, combo):
                        setattr(o, at, x)
                    try:
                        return one()
                    finally:
                        for (_, o, at, _v), x in zip(knobs, defaults):
                            setattr(o, at, x)
                before = _device_allocs(a.device)
                res = arm()
                allocs[label] = [_device_allocs(a.device) - before]
                ratios[(w, *combo)] = {l.name: l.iso.ratio for l in res.layers if l.iso}
                fns[label] = arm
        if a.bare:
            fns["bare"] = _bare(model, meta, reader)
        picked: list[int] = []            # what --parity-threads=auto chose, pass by pass
        real_pick = direct.CHOOSER.pick

        def pick(key: Any, real_pick: Any = real_pick) -> int:
            picked.append(real_pick(key))
            return picked[-1]
        direct.CHOOSER.pick = pick        # type: ignore[method-assign]
        raw: dict[str, list[float]] = {}
        probed: dict[str, list[int]] = {}
        got = interleaved(fns, a.device, a.reps, raw, lambda: _device_allocs(a.device), probed)
        for label in allocs:
            allocs[label] += probed.get(label, [])
        direct.CHOOSER.pick = real_pick   # type: ignore[method-assign]
        row: dict[str, Any] = {"model": name, **{f"{k}_ms": v * 1e3 for k, v in got.items()}}
        for k, v in got.items():
            if k != "forward":
                row[f"{k}_x"] = v / got["forward"]
                row[f"{k}_xp"] = statistics.median(x / f for x, f in zip(raw[k], raw["forward"]))
        base = ratios[min(ratios)]
        row["same_ratios"] = {f"w{arm[0]}" + "".join(_label(tag, x) for (tag, *_), x in zip(knobs, arm[1:])):
                              all(abs(r[k] - base[k]) <= 1e-6 * max(1.0, abs(base[k])) for k in base)
                              for arm, r in ratios.items()}
        row["columns_errors"] = stats_graph.COLUMNS_ERRORS
        row["host_pointer_errors"] = kernels.HOST_POINTER_ERRORS
        row["capture_errors"] = stats_graph.CAPTURE_ERRORS
        # what --parity-threads=auto measured (seconds per call, per arm) and how often it chose
        row["auto_samples"] = {str(k): {arm: [round(x * 1e6, 2) for x in v] for arm, v in s.items()}
                               for k, s in direct.CHOOSER.samples.items()}
        row["auto_picks"] = {str(k): v for k, v in direct.CHOOSER.picks.items()}
        row["launch_bytes_default"] = defaults[0]
        row["auto_sequence"] = picked
        row["raw_ms"] = {k: [round(x * 1e3, 3) for x in v] for k, v in raw.items()}
        row["device_allocs"] = allocs    # the set-up pass first, then one per rep
        # what one read of that counter costs the host: sweeps before session 14 read it twice inside
        # each pass arm's timing (neither the forward's nor the bare loop's)
        probe_t = []
        for _ in range(50):
            t0 = time.perf_counter()
            _device_allocs(a.device)
            probe_t.append(time.perf_counter() - t0)
        row["alloc_probe_us"] = statistics.median(probe_t) * 1e6
        rows.append(row)
        print(json.dumps(row), flush=True)
        reader.release()
        del model, one
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
    write_rows(a.out, a.device, rows)
    return 0


def _bare(model: Any, meta: dict[str, Any], reader: Any) -> Any:
    """The level-0 modules called on their golden inputs in the model's order, and nothing else."""
    import torch

    from pytest_rocm_parity import direct

    calls = direct.plan_level(meta, {e["key"]: e for e in meta["layers"]}, 0)
    assert isinstance(calls, list), calls
    built = [(m, *c.make(reader.get)) for c, m in zip(calls, direct.resolve_modules(model, calls))]

    def bare() -> None:
        with torch.inference_mode():
            outs = [m(*args, **kwargs) for m, args, kwargs in built]   # held to the end, as a pass's are
        del outs
    return bare


def _device_allocs(device: str) -> int:
    """cudaMalloc calls the caching allocator has made so far (a pass that makes any pays for them)."""
    import torch

    return int(torch.cuda.memory_stats().get("num_device_alloc", 0)) if device.startswith("cuda") else 0


def _label(tag: str, value: Any) -> str:
    """An arm's name piece: _l128 for 128 MiB, _hon / _hoff for a switch."""
    if isinstance(value, bool):
        return f"_{tag}{'on' if value else 'off'}"
    return f"_{tag}{int(value) >> 20}"


if __name__ == "__main__":
    sys.exit(main())

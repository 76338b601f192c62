#!/usr/bin/env bash
# The NVIDIA reference's performance runs (issue 8): GPU tests, the statistics kernel's launch shapes,
# then the capture/replay benchmark. Part "a": tests, kernel sweep, tiny and 1.1B with profiles;
# "c": tests, the fast pass's phases at 1.1B, tiny and 1.1B with profiles; "b": tests, tiny, 1.1B
# and 8B, the phases at 1.1B; "d" (what docs/benchmarks.md reports since session 4): "b" with the
# direct calls' thread sweep (1, 2 and auto since session 5); "e": d's parts in another order,
# without the 8B capture benchmark; "f": e at 1.1B only (session 5's device time); "g": f with the
# statistics started in parts during the pass, LAUNCH_BYTES arms beside the old flush (session 6);
# "h": the judging formulas as one kernel, arms with and without it (session 6); "i": the statistics
# kernel's vectorised loop: its launch shapes by device time, the fast pass with and without it, and
# the device timeline of a pass beside a forward (session 7); "j": the rows on session 7's shipped code;
# "k": the thread sweep pinned to each half of the host's cores (taskset), with the host's topology;
# "l": auto without its warm-up samples: the sweep in two processes, then bench_parity at 1.1B;
# "m": the sweep with 60 alternations, in two processes; "n": GPU tests, one-thread host profile;
# "o": GPU tests, the statistics kernel's compact grid, a one-thread pass's statistics start piece by piece;
# "p": GPU tests, statistics graphs on host tables: phases with and without parts, the sweep with arms;
# "q": a one-thread pass's host profile, callee by callee; the sweep with parts from 96 MiB, twice;
# "r": the shipped code: GPU tests, bench_parity at 1.1B, the sweep twice with 30 alternations;
# "s": a warm one-thread pass's phases with a start's pieces, bench_parity at 1.1B, the sweep;
# "t": the final code's GPU tests and a warm one-thread pass's host profile;
# "u": GPU tests, then parts of the statistics on a side stream beside the calls: the sweep (1 thread
# and auto x parts 0/128/384 MiB x side stream on/off) in two processes, a warm pass's phases with
# and without parts, the default's host profile;
# "v": one thread, two and auto side by side, pass by pass, in two processes; bench_parity at 1.1B;
# "w": the final code's GPU tests, then v without bench_parity;
# "x": v's sweep, short (20 alternations), with each pass's new device allocations: auto's slow early passes;
# "y": GPU tests, a statistics start's pieces at 27 leaves, then bench_ab.py in two processes: the replay
# of ab/old (an export of an earlier commit: `git archive REV pytest_rocm_parity | tar -x -C ab/old`, not
# committed) beside this tree's, round by round;
# "z": y without the start's pieces, then x's sweep in two processes and bench_parity at 1.1B (session 10's final code);
# "A": GPU tests, then one thread and auto with the repeated blocks' calls last or in the model's order,
# beside the modules alone on their golden inputs (bare), in three processes; a warm one-thread pass's
# host waits for the device and its device timeline beside the forward's (session 11);
# "B": the harness's host time per direct call on the GPU's host (bench_host_overhead.py, thin and
# 1.1B, with and without its phase timers), then one process of A's sweep (one thread, auto, bare)
# and A's warm one-thread diagnostic (session 12);
# "C": GPU tests, then the statistics of the calls before the repeated blocks started beside them
# (PART_BEFORE_BLOCKS on/off, one thread and auto, bare) in two processes at 1.1B and one at 8B, a
# warm one-thread pass's device timeline with it on, bench_parity at 1.1B (session 12);
# "D": the default (one thread, auto, bare) in three processes and bench_parity at 1.1B twice:
# how often the default meets 1.05x across a lease (session 12's final code);
# "E": a warm one-thread pass's host profile with this package's functions and the per-call ones'
# callees, and the host time per direct call of the thin model (session 12).
# "F": GPU tests, then bench_ab.py (ab/old: session 12's final code) in two processes, one thread and
# auto; the slots and restarts arms (on/off each, one thread, bare) in one process (session 13);
# "G": bench_parity at 1.1B (the recording forward now under no_grad), the host time per direct call
# of the thin model, a warm one-thread pass's phases (session 13);
# "H": GPU tests (the capture's unit tests on CUDA among them), bench_ab.py against session 12's code
# in two processes, the sweep with slots and kept inputs on/off (one thread, bare), bench_parity at
# 1.1B twice (the recording forward merging repeats after the forward), a warm one-thread pass's
# phases (session 13's final code);
# "I": the recording forward of session 12's code beside this tree's (bench_ab.py --capture) in two
# processes, then bench_parity at 1.1B (session 13);
# "J": the final code: GPU tests (the capture's on CUDA among them), I's capture comparison in two
# processes, bench_ab.py's replay comparison once, bench_parity at 1.1B (session 13);
# "K": D's sweep (one thread, auto, bare) in two processes on the final code (session 13);
# "L": slots for tuple outputs (the rotary tables), so the 1.1B level restarts its statistics: GPU
# tests, a warm one-thread pass's phases, bench_ab.py once (session 13);
# "M": GPU tests, then a part of the statistics before the level's last blocks (PART_BEFORE_LAST 0/2,
# one thread and auto, bare) in two processes, and a warm one-thread pass's phases with 0 and 2 (session 14);
# "N": that part on the side stream or the main one (PART_BEFORE_LAST 0/2 x SIDE_STREAM on/off, one
# thread) in two processes, a warm one-thread pass's phases with the part on the main stream (session 14).
# M and N ran at 6b00776 and 7de1e6b (`git show 7de1e6b:scripts/gpu_bench.sh`): the switch they measured
# was left off, then removed from the code;
# "O": the thin model's harness time per direct call on the GPU's host, then K's sweep in two processes (session 14);
# "P": that harness time split (outputs kept, run_level's loop, the queueing), thin model twice and 1.1B (session 14);
# "Q": GPU tests, then a level's slotted outputs queued after its calls or as each returns (DEFER_SLOTS):
# the thin model's host time both ways, the sweep (on/off, one thread and auto, bare) in two processes (session 14);
# "R": bench_ab.py against session 13's final code (ab/old: an export of 42d76ea) in three processes (session 14);
# "S": the final code: K's sweep (one thread, auto, bare) in two processes, then R's comparison in two (session 14);
# "T": K's sweep with the device-allocation counter read outside each pass's timing, in two processes (session 14).
# Results under $OUT.
set -uo pipefail
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
L="$OUT"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"; nproc; } > "$L/env.txt" 2>&1
part="${1:-a}"
sweep() {   # the 1.1B fast pass's sweep (one thread, auto, bare) in processes 1..$1, $2 s each; more flags after
  local n=$1 t=$2 i
  shift 2
  for i in $(seq 1 "$n"); do
    timeout "$t" python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --bare --reps 30 "$@" \
      --out "$L/threads_p$i.json" > "$L/threads_p$i.log" 2>&1
    echo "threads p$i rc=$?" >> "$L/env.txt"
  done
}
ab() {      # bench_ab.py against ab/old (one thread, auto; 40 rounds) in processes 1..$1, $2 s each
  local n=$1 t=$2 i
  for i in $(seq 1 "$n"); do
    timeout "$t" python bench/bench_ab.py --old ab/old/pytest_rocm_parity --device cuda --model 1b --threads 1,auto --reps 40 \
      --out "$L/ab_p$i.json" > "$L/ab_p$i.log" 2>&1
    echo "ab p$i rc=$?" >> "$L/env.txt"; grep -E '"(old|new)_x_paired"|new_over_old|new_faster|forward_ms|same' "$L/ab_p$i.log"
  done
}
if [[ "$part" == a ]]; then
  timeout 170 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu tests/unit/test_capture_fast.py \
    tests/unit/test_inplace.py tests/unit/test_direct.py -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"
  timeout 120 python bench/bench_stats_kernel.py --model 1b --out "$L/stats_kernel.json" > "$L/stats_kernel.log" 2>&1
  echo "stats kernel rc=$?" >> "$L/env.txt"
  timeout 260 python bench/bench_parity.py --device cuda --models tiny,1b --reps 15 --profile-dir "$L" --out "$L/bench_a.json" > "$L/bench_a.log" 2>&1
  echo "bench tiny,1b rc=$?" >> "$L/env.txt"
fi
if [[ "$part" == c ]]; then   # where a fast pass's time goes, then the benchmark of tiny and 1.1B
  timeout 170 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu tests/unit/test_capture_fast.py \
    tests/unit/test_inplace.py tests/unit/test_direct.py -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"
  timeout 150 python bench/diag_fast_pass.py --device cuda --model 1b --out "$L/diag_1b.json" > "$L/diag_1b.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1b.log"
  timeout 240 python bench/bench_parity.py --device cuda --models tiny,1b --reps 15 --profile-dir "$L" --out "$L/bench_c.json" > "$L/bench_c.log" 2>&1
  echo "bench tiny,1b rc=$?" >> "$L/env.txt"
fi
if [[ "$part" == b ]]; then   # the GPU tests, all three models, the fast pass's phases at 1.1B
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu tests/unit/test_capture_fast.py \
    tests/unit/test_inplace.py tests/unit/test_direct.py -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"
  timeout 380 python bench/bench_parity.py --device cuda --models tiny,1b,8b --reps 15 --out "$L/bench_b.json" > "$L/bench_b.log" 2>&1
  echo "bench tiny,1b,8b rc=$?" >> "$L/env.txt"
  timeout 90 python bench/diag_fast_pass.py --device cuda --model 1b --out "$L/diag_1b.json" > "$L/diag_1b.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1b.log"
fi
if [[ "$part" == d ]]; then   # part b with the thread sweep of the direct calls (session 4)
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"
  timeout 300 python bench/bench_parity.py --device cuda --models tiny,1b,8b --reps 15 --out "$L/bench_d.json" > "$L/bench_d.log" 2>&1
  echo "bench tiny,1b,8b rc=$?" >> "$L/env.txt"
  timeout 150 python bench/bench_direct_threads.py --device cuda --models 1b,8b --workers 1,2,auto --out "$L/threads.json" > "$L/threads.log" 2>&1
  echo "threads rc=$?" >> "$L/env.txt"; cat "$L/threads.log"
  timeout 60 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --out "$L/diag_1b.json" > "$L/diag_1b.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1b.log"
fi
if [[ "$part" == e ]]; then   # session 5: d's parts, the thread sweep first, bench_parity without 8B
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"
  timeout 150 python bench/bench_direct_threads.py --device cuda --models 1b,8b --workers 1,2,auto --out "$L/threads.json" > "$L/threads.log" 2>&1
  echo "threads rc=$?" >> "$L/env.txt"; cat "$L/threads.log"
  timeout 60 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --out "$L/diag_1b.json" > "$L/diag_1b.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1b.log"
  timeout 200 python bench/bench_parity.py --device cuda --models tiny,1b --reps 15 --out "$L/bench_e.json" > "$L/bench_e.log" 2>&1
  echo "bench tiny,1b rc=$?" >> "$L/env.txt"
fi
if [[ "$part" == f ]]; then   # session 5, short: the GPU tests, the 1.1B thread sweep, its phases, bench_parity 1.1B
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"
  timeout 90 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,2,auto --out "$L/threads.json" > "$L/threads.log" 2>&1
  echo "threads rc=$?" >> "$L/env.txt"; cat "$L/threads.log"
  timeout 50 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --out "$L/diag_1b.json" > "$L/diag_1b.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1b.log"
  timeout 100 python bench/bench_parity.py --device cuda --models 1b --reps 15 --out "$L/bench_f.json" > "$L/bench_f.log" 2>&1
  echo "bench 1b rc=$?" >> "$L/env.txt"
fi
if [[ "$part" == g ]]; then   # session 6: statistics started in parts during the pass (LAUNCH_BYTES arms, 0 = before)
  timeout 120 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"
  timeout 220 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,2,auto --launch-mb 0,16,32,128 --out "$L/threads.json" > "$L/threads.log" 2>&1
  echo "threads rc=$?" >> "$L/env.txt"; cat "$L/threads.log"
  timeout 60 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --out "$L/diag_1b.json" > "$L/diag_1b.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1b.log"
  timeout 150 python bench/bench_parity.py --device cuda --models tiny,1b --reps 15 --out "$L/bench_g.json" > "$L/bench_g.log" 2>&1
  echo "bench tiny,1b rc=$?" >> "$L/env.txt"
fi
if [[ "$part" == h ]]; then   # session 6: the judging formulas as one kernel, beside the torch/numpy formulas
  timeout 120 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"
  for n in 4 25; do timeout 60 python bench/bench_stats_start.py --leaves $n --iters 100 --out "$L/start$n.json" > /dev/null 2>&1; done
  echo "start rc=$?" >> "$L/env.txt"; cat "$L"/start*.json
  timeout 200 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,2,auto --columns-kernel on,off --out "$L/threads.json" > "$L/threads.log" 2>&1
  echo "threads rc=$?" >> "$L/env.txt"; cat "$L/threads.log"
  timeout 60 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --out "$L/diag_1b.json" > "$L/diag_1b.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1b.log"
fi
if [[ "$part" == i ]]; then   # session 7: the vectorised statistics loop; where a pass's device time goes
  timeout 90 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  timeout 170 python bench/bench_stats_kernel.py --model 1b --out "$L/stats_kernel.json" > "$L/stats_kernel.log" 2>&1
  echo "stats kernel rc=$?" >> "$L/env.txt"; cat "$L/stats_kernel.log"
  timeout 180 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,2,auto --aligned-loads on,off --out "$L/threads.json" > "$L/threads.log" 2>&1
  echo "threads rc=$?" >> "$L/env.txt"; cat "$L/threads.log"
  timeout 100 python bench/diag_fast_pass.py --device cuda --model 1b --threads auto --reps 10 --trace "$L/trace_auto.json" --out "$L/diag_1b.json" > "$L/diag_1b.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1b.log"
fi
if [[ "$part" == j ]]; then   # session 7: the rows on the code as shipped (vectorised loop, 4 warps)
  timeout 80 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  timeout 150 python bench/bench_parity.py --device cuda --models tiny,1b --reps 15 --out "$L/bench_j.json" > "$L/bench_j.log" 2>&1
  echo "bench tiny,1b rc=$?" >> "$L/env.txt"
  timeout 120 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,2,auto --out "$L/threads.json" > "$L/threads.log" 2>&1
  echo "threads rc=$?" >> "$L/env.txt"; cat "$L/threads.log"
  timeout 100 python bench/diag_fast_pass.py --device cuda --model 1b --threads auto --reps 10 --trace "$L/trace_auto.json" --out "$L/diag_1b.json" > "$L/diag_1b.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1b.log"
fi
if [[ "$part" == k ]]; then   # session 7: does the forward's speed follow the cores the process runs on?
  { lscpu; nvidia-smi topo -m; } > "$L/topology.txt" 2>&1
  for cores in 0-7 8-15; do
    taskset -c "$cores" timeout 110 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --reps 10 --out "$L/threads_cores$cores.json" > "$L/threads_cores$cores.log" 2>&1
    echo "threads cores $cores rc=$?" >> "$L/env.txt"; tail -1 "$L/threads_cores$cores.log" | cut -c1-400
  done
fi
if [[ "$part" == l ]]; then   # session 7: auto without its warm-up samples, twice (two processes), then the 1.1B row
  for n in 1 2; do
    timeout 110 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,2,auto --reps 15 --out "$L/threads_p$n.json" > "$L/threads_p$n.log" 2>&1
    echo "threads process $n rc=$?" >> "$L/env.txt"; tail -1 "$L/threads_p$n.log" | cut -c1-420
  done
  timeout 150 python bench/bench_parity.py --device cuda --models 1b --reps 15 --out "$L/bench_l.json" > "$L/bench_l.log" 2>&1
  echo "bench 1b rc=$?" >> "$L/env.txt"
fi
if [[ "$part" == m ]]; then   # session 7: the sweep with 60 alternations (the host's speed drifts within a process)
  for n in 1 2; do
    timeout 130 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,2,auto --reps 60 --out "$L/threads60_p$n.json" > "$L/threads60_p$n.log" 2>&1
    echo "threads reps 60 process $n rc=$?" >> "$L/env.txt"; tail -1 "$L/threads60_p$n.log" | cut -c1-330
  done
fi
if [[ "$part" == n ]]; then   # session 7, last: GPU tests on the final code; the host profile of one-thread passes
  timeout 80 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  timeout 110 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --reps 15 --profile "$L/prof_1t.txt" --out "$L/diag_1t.json" > "$L/diag_1t.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; head -16 "$L/diag_1t.log"
fi
if [[ "$part" == o ]]; then   # session 8, first: GPU tests, the compact grid's device time, a one-thread start piece by piece
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  timeout 120 python bench/bench_stats_kernel.py --model 1b --out "$L/stats_kernel.json" > "$L/stats_kernel.log" 2>&1
  echo "stats kernel rc=$?" >> "$L/env.txt"; tail -12 "$L/stats_kernel.log"
  timeout 110 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --reps 20 --out "$L/diag_1t.json" > "$L/diag_1t.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; head -30 "$L/diag_1t.log"
fi
if [[ "$part" == p ]]; then   # session 8: statistics graphs that read addresses from (and write columns to) pinned host memory
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  timeout 80 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --reps 20 --out "$L/diag_1t.json" > "$L/diag_1t.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; head -30 "$L/diag_1t.log"
  timeout 80 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --reps 20 --launch-mb 128 --out "$L/diag_1t_l128.json" > "$L/diag_1t_l128.log" 2>&1
  echo "diag l128 rc=$?" >> "$L/env.txt"; head -30 "$L/diag_1t_l128.log"
  timeout 150 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --launch-mb 0,64,128 --host-pointers on,off --out "$L/threads.json" > "$L/threads.log" 2>&1
  echo "threads rc=$?" >> "$L/env.txt"; cat "$L/threads.log"
fi
if [[ "$part" == q ]]; then   # session 8: where a start's host time goes (profile), parts from 96 MiB (the logits alone), many alternations
  timeout 90 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --reps 20 --profile "$L/prof_1t.txt" --out "$L/diag_1t.json" > "$L/diag_1t.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; head -30 "$L/diag_1t.log"
  for i in 1 2; do
    timeout 150 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --launch-mb 0,96 --reps 30 --out "$L/threads_p$i.json" > "$L/threads_p$i.log" 2>&1
    echo "threads p$i rc=$?" >> "$L/env.txt"; cat "$L/threads_p$i.log"
  done
fi
if [[ "$part" == r ]]; then   # session 8, the shipped code: GPU tests, bench_parity at 1.1B, the sweep twice with 30 alternations
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  timeout 150 python bench/bench_parity.py --device cuda --models 1b --reps 15 --out "$L/bench_r.json" > "$L/bench_r.log" 2>&1
  echo "bench 1b rc=$?" >> "$L/env.txt"
  for i in 1 2; do
    timeout 120 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --reps 30 --out "$L/threads_p$i.json" > "$L/threads_p$i.log" 2>&1
    echo "threads p$i rc=$?" >> "$L/env.txt"; cat "$L/threads_p$i.log"
  done
fi
if [[ "$part" == s ]]; then   # session 8, last: a warm one-thread pass's phases with the start's pieces; bench_parity and the sweep again
  timeout 90 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --warm --reps 30 --out "$L/diag_warm_1t.json" > "$L/diag_warm_1t.log" 2>&1
  echo "diag warm rc=$?" >> "$L/env.txt"; head -34 "$L/diag_warm_1t.log"
  timeout 150 python bench/bench_parity.py --device cuda --models 1b --reps 15 --out "$L/bench_s.json" > "$L/bench_s.log" 2>&1
  echo "bench 1b rc=$?" >> "$L/env.txt"
  timeout 120 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --reps 30 --out "$L/threads.json" > "$L/threads.log" 2>&1
  echo "threads rc=$?" >> "$L/env.txt"; cat "$L/threads.log"
fi
if [[ "$part" == t ]]; then   # session 8, final code: GPU tests; a warm one-thread pass's host profile (what lies outside the timed phases)
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  timeout 90 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --warm --reps 30 --profile "$L/prof_warm_1t.txt" --out "$L/diag_warm_1t.json" > "$L/diag_warm_1t.log" 2>&1
  echo "diag warm rc=$?" >> "$L/env.txt"; head -34 "$L/diag_warm_1t.log"
fi
if [[ "$part" == u ]]; then   # session 9: the statistics' parts on a side stream, beside the calls
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  for i in 1 2; do
    timeout 110 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --launch-mb 0,128,384 \
      --side-stream on,off --reps 30 --out "$L/threads_p$i.json" > "$L/threads_p$i.log" 2>&1
    echo "threads p$i rc=$?" >> "$L/env.txt"
  done
  timeout 80 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --warm --reps 30 --launch-mb 128 \
    --side-stream on --out "$L/diag_side.json" > "$L/diag_side.log" 2>&1
  echo "diag side rc=$?" >> "$L/env.txt"; head -34 "$L/diag_side.log"
  timeout 80 python bench/diag_fast_pass.py --device cuda --model 1b --threads 1 --warm --reps 30 \
    --profile "$L/prof_warm_1t.txt" --out "$L/diag_warm_1t.json" > "$L/diag_warm_1t.log" 2>&1
  echo "diag warm rc=$?" >> "$L/env.txt"; head -34 "$L/diag_warm_1t.log"
fi
if [[ "$part" == w ]]; then   # session 9, final code: GPU tests first
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
fi
if [[ "$part" == x || "$part" == z ]]; then   # session 9: what makes auto's first one-thread passes slow on a fast host
  for i in 1 2; do
    timeout 90 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,2,auto --reps 20 \
      --out "$L/threads_p$i.json" > "$L/threads_p$i.log" 2>&1
    echo "threads p$i rc=$?" >> "$L/env.txt"
  done
fi
if [[ "$part" == y || "$part" == z ]]; then   # session 10: GPU tests, a start's pieces, then an earlier commit's pass beside this tree's
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  if [[ "$part" == y ]]; then
    timeout 60 python bench/bench_stats_start.py --leaves 27 --numel 4194304 --iters 200 --out "$L/stats_start.json" > "$L/stats_start.log" 2>&1
    echo "stats start rc=$?" >> "$L/env.txt"; cat "$L/stats_start.log"
  fi
  for i in 1 2; do
    timeout 120 python bench/bench_ab.py --old ab/old/pytest_rocm_parity --device cuda --model 1b --threads 1,auto \
      --reps 40 --out "$L/ab_p$i.json" > "$L/ab_p$i.log" 2>&1
    echo "ab p$i rc=$?" >> "$L/env.txt"; head -30 "$L/ab_p$i.log"
  done
fi
if [[ "$part" == z ]]; then
  timeout 150 python bench/bench_parity.py --device cuda --models 1b --reps 15 --out "$L/bench_z.json" > "$L/bench_z.log" 2>&1
  echo "bench 1b rc=$?" >> "$L/env.txt"
fi
if [[ "$part" == v || "$part" == w ]]; then   # session 9: is auto's choice the faster arm? every pass's time and pick
  for i in 1 2; do
    timeout 110 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,2,auto --reps 40 \
      --out "$L/threads_p$i.json" > "$L/threads_p$i.log" 2>&1
    echo "threads p$i rc=$?" >> "$L/env.txt"
  done
  if [[ "$part" == v ]]; then
    timeout 150 python bench/bench_parity.py --device cuda --models 1b --reps 15 --out "$L/bench_v.json" > "$L/bench_v.log" 2>&1
    echo "bench 1b rc=$?" >> "$L/env.txt"
  fi
fi
if [[ "$part" == A ]]; then
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"
  for i in 1 2 3; do
    timeout 120 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --blocks-last on,off --bare \
      --reps 30 --out "$L/threads_p$i.json" > "$L/threads_p$i.log" 2>&1
    echo "threads p$i rc=$?" >> "$L/env.txt"
  done
  timeout 150 python bench/diag_fast_pass.py --device cuda --model 1b --warm --threads 1 --sync-debug --trace "$L/trace_1t.json" \
    --out "$L/diag_1t.json" > "$L/diag_1t.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1t.log"
fi
if [[ "$part" == B ]]; then
  for m in thin 1b; do
    for ph in "" --phases; do
      timeout 150 python bench/bench_host_overhead.py --device cuda --model $m --reps $([[ $m == thin ]] && echo 300 || echo 60) \
        $ph --out "$L/host_$m${ph:+_phases}.json" > "$L/host_$m${ph:+_phases}.log" 2>&1
      echo "host $m $ph rc=$?" >> "$L/env.txt"; tail -1 "$L/host_$m${ph:+_phases}.log"
    done
  done
  timeout 150 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --bare \
    --reps 30 --out "$L/threads_p1.json" > "$L/threads_p1.log" 2>&1
  echo "threads p1 rc=$?" >> "$L/env.txt"
  timeout 150 python bench/diag_fast_pass.py --device cuda --model 1b --warm --threads 1 --sync-debug --trace "$L/trace_1t.json" \
    --out "$L/diag_1t.json" > "$L/diag_1t.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1t.log"
fi
if [[ "$part" == C ]]; then
  timeout 110 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  for i in 1 2 8; do
    timeout 100 python bench/bench_direct_threads.py --device cuda --models $([[ $i == 8 ]] && echo 8b || echo 1b) --workers 1,auto \
      --part-before-blocks on,off --bare --reps $([[ $i == 8 ]] && echo 10 || echo 30) --out "$L/threads_p$i.json" > "$L/threads_p$i.log" 2>&1
    echo "threads p$i rc=$?" >> "$L/env.txt"
  done
  timeout 80 python bench/diag_fast_pass.py --device cuda --model 1b --warm --threads 1 --part-before-blocks on \
    --trace "$L/trace_1t_pon.json" --out "$L/diag_1t_pon.json" > "$L/diag_1t_pon.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1t_pon.log"
  timeout 130 python bench/bench_parity.py --device cuda --models 1b --reps 15 --out "$L/bench_C.json" > "$L/bench_C.log" 2>&1
  echo "bench 1b rc=$?" >> "$L/env.txt"
fi
if [[ "$part" == D ]]; then
  for i in 1 2 3; do
    timeout 90 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1,auto --bare \
      --reps 30 --out "$L/threads_p$i.json" > "$L/threads_p$i.log" 2>&1
    echo "threads p$i rc=$?" >> "$L/env.txt"
  done
  for i in 1 2; do
    timeout 120 python bench/bench_parity.py --device cuda --models 1b --reps 15 --out "$L/bench_D$i.json" > "$L/bench_D$i.log" 2>&1
    echo "bench 1b ($i) rc=$?" >> "$L/env.txt"; tail -1 "$L/bench_D$i.log"
  done
fi
if [[ "$part" == E ]]; then
  timeout 150 python bench/diag_fast_pass.py --device cuda --model 1b --warm --threads 1 --reps 30 --profile "$L/prof_1t.txt" \
    --out "$L/diag_prof.json" > "$L/diag_prof.log" 2>&1
  echo "diag prof rc=$?" >> "$L/env.txt"
  timeout 100 python bench/bench_host_overhead.py --device cuda --model thin --reps 300 --out "$L/host_thin.json" > "$L/host_thin.log" 2>&1
  echo "host thin rc=$?" >> "$L/env.txt"; tail -1 "$L/host_thin.log"
fi
if [[ "$part" == F ]]; then
  timeout 150 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  for i in 1 2; do
    timeout 110 python bench/bench_ab.py --old ab/old/pytest_rocm_parity --device cuda --model 1b --threads 1,auto --reps 40 \
      --out "$L/ab_p$i.json" > "$L/ab_p$i.log" 2>&1
    echo "ab p$i rc=$?" >> "$L/env.txt"; cat "$L/ab_p$i.log"
  done
  timeout 150 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1 --slots on,off --restarts on,off --bare \
    --reps 30 --out "$L/threads_p1.json" > "$L/threads_p1.log" 2>&1
  echo "threads p1 rc=$?" >> "$L/env.txt"
fi
if [[ "$part" == G ]]; then
  timeout 150 python bench/bench_parity.py --device cuda --models 1b --reps 15 --out "$L/bench_G.json" > "$L/bench_G.log" 2>&1
  echo "bench 1b rc=$?" >> "$L/env.txt"; tail -1 "$L/bench_G.log"
  timeout 100 python bench/bench_host_overhead.py --device cuda --model thin --reps 300 --out "$L/host_thin.json" > "$L/host_thin.log" 2>&1
  echo "host thin rc=$?" >> "$L/env.txt"; tail -1 "$L/host_thin.log"
  timeout 100 python bench/diag_fast_pass.py --device cuda --model 1b --warm --threads 1 --sync-debug \
    --out "$L/diag_1t.json" > "$L/diag_1t.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1t.log"
fi
if [[ "$part" == H ]]; then
  timeout 150 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu tests/unit/test_capture_fast.py \
    tests/unit/test_inplace.py tests/unit/test_direct.py -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  for i in 1 2; do
    timeout 100 python bench/bench_ab.py --old ab/old/pytest_rocm_parity --device cuda --model 1b --threads 1,auto --reps 40 \
      --out "$L/ab_p$i.json" > "$L/ab_p$i.log" 2>&1
    echo "ab p$i rc=$?" >> "$L/env.txt"; grep -E '"(old|new)_x_paired"|new_over_old|forward_ms' "$L/ab_p$i.log"
  done
  timeout 120 python bench/bench_direct_threads.py --device cuda --models 1b --workers 1 --slots on,off --keep-inputs on,off --bare \
    --reps 30 --out "$L/threads_p1.json" > "$L/threads_p1.log" 2>&1
  echo "threads p1 rc=$?" >> "$L/env.txt"
  for i in 1 2; do
    timeout 100 python bench/bench_parity.py --device cuda --models 1b --reps 15 --out "$L/bench_H$i.json" > "$L/bench_H$i.log" 2>&1
    echo "bench 1b ($i) rc=$?" >> "$L/env.txt"; tail -1 "$L/bench_H$i.log"
  done
  timeout 60 python bench/diag_fast_pass.py --device cuda --model 1b --warm --threads 1 \
    --out "$L/diag_1t.json" > "$L/diag_1t.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1t.log"
fi
if [[ "$part" == I ]]; then
  for i in 1 2; do
    timeout 100 python bench/bench_ab.py --old ab/old/pytest_rocm_parity --device cuda --model 1b --capture --reps 30 \
      --out "$L/abcap_p$i.json" > "$L/abcap_p$i.log" 2>&1
    echo "ab capture p$i rc=$?" >> "$L/env.txt"; cat "$L/abcap_p$i.log"
  done
  timeout 100 python bench/bench_parity.py --device cuda --models 1b --reps 15 --out "$L/bench_I.json" > "$L/bench_I.log" 2>&1
  echo "bench 1b rc=$?" >> "$L/env.txt"; tail -1 "$L/bench_I.log"
fi
if [[ "$part" == J ]]; then
  timeout 150 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu tests/unit/test_capture_fast.py \
    tests/unit/test_inplace.py tests/unit/test_direct.py -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  for i in 1 2; do
    timeout 100 python bench/bench_ab.py --old ab/old/pytest_rocm_parity --device cuda --model 1b --capture --reps 30 \
      --out "$L/abcap_p$i.json" > "$L/abcap_p$i.log" 2>&1
    echo "ab capture p$i rc=$?" >> "$L/env.txt"; grep -E "x_paired|new_over_old|forward_ms" "$L/abcap_p$i.log"
  done
  timeout 100 python bench/bench_ab.py --old ab/old/pytest_rocm_parity --device cuda --model 1b --threads 1,auto --reps 40 \
    --out "$L/ab_p1.json" > "$L/ab_p1.log" 2>&1
  echo "ab p1 rc=$?" >> "$L/env.txt"; grep -E '"(old|new)_x_paired"|new_over_old|forward_ms' "$L/ab_p1.log"
  timeout 100 python bench/bench_parity.py --device cuda --models 1b --reps 15 --out "$L/bench_J.json" > "$L/bench_J.log" 2>&1
  echo "bench 1b rc=$?" >> "$L/env.txt"; tail -1 "$L/bench_J.log"
fi
if [[ "$part" == K ]]; then
  sweep 2 100
fi
if [[ "$part" == L ]]; then
  timeout 90 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  timeout 60 python bench/diag_fast_pass.py --device cuda --model 1b --warm --threads 1 \
    --out "$L/diag_1t.json" > "$L/diag_1t.log" 2>&1
  echo "diag rc=$?" >> "$L/env.txt"; cat "$L/diag_1t.log"
  timeout 90 python bench/bench_ab.py --old ab/old/pytest_rocm_parity --device cuda --model 1b --threads 1,auto --reps 40 \
    --out "$L/ab_p1.json" > "$L/ab_p1.log" 2>&1
  echo "ab p1 rc=$?" >> "$L/env.txt"; grep -E '"(old|new)_x_paired"|new_over_old|forward_ms|same' "$L/ab_p1.log"
fi
if [[ "$part" == O ]]; then
  timeout 90 python bench/bench_host_overhead.py --device cuda --model thin --reps 200 --out "$L/host_thin.json" \
    > "$L/host_thin.log" 2>&1
  echo "host thin rc=$?" >> "$L/env.txt"; tail -1 "$L/host_thin.log"
  sweep 2 130
fi
if [[ "$part" == P ]]; then
  for mi in thin:1 thin:2 1b:1; do
    m=${mi%%:*}
    timeout 90 python bench/bench_host_overhead.py --device cuda --model $m --reps 200 --out "$L/host_${m}_${mi##*:}.json" \
      > "$L/host_${m}_${mi##*:}.log" 2>&1
    echo "host $mi rc=$?" >> "$L/env.txt"; tail -1 "$L/host_${m}_${mi##*:}.log"
  done
fi
if [[ "$part" == Q ]]; then
  timeout 100 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"; tail -3 "$L/gpu_tests.log"
  for d in on off on off; do
    timeout 60 python bench/bench_host_overhead.py --device cuda --model thin --reps 150 $([[ $d == off ]] && echo --no-defer) \
      >> "$L/host_thin.log" 2>&1
    echo "host thin defer $d rc=$?" >> "$L/env.txt"; tail -1 "$L/host_thin.log"
  done
  sweep 2 130 --defer-slots on,off
fi
if [[ "$part" == R ]]; then
  ab 3 150
fi
if [[ "$part" == S ]]; then
  sweep 2 120
  ab 2 100
fi
if [[ "$part" == T ]]; then
  sweep 2 120
  for i in 1 2; do
    python -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print('alloc probe us', round(r['alloc_probe_us'], 1))" "$L/threads_p$i.json"
  done
fi
cat "$L/env.txt"
tail -3 "$L/gpu_tests.log" 2>/dev/null
tail -1 "$L/stats_kernel.log" 2>/dev/null
python - "$L" <<'PY'
import json, statistics, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/threads_p*.json")):   # the sweeps of parts u, v, w
    r = json.load(open(f))["rows"][0]
    print(f.rsplit("/", 1)[-1], "fwd", round(r["forward_ms"], 2),
          {k[5:-2]: round(v, 3) for k, v in r.items() if k.endswith("_x")},
          {k[5:]: round(v, 3) for k, v in r.items() if k.endswith("_xp")})
    print("  same", all(r["same_ratios"].values()), "errors", r["capture_errors"], r["host_pointer_errors"])
    if r.get("auto_sequence"):
        print("  picks", "".join(map(str, r["auto_sequence"])), r["auto_samples"])
    for k, v in r.get("raw_ms", {}).items():   # medians of each ten passes: the host's drift
        print("  ", k, [round(statistics.median(v[j:j + 10]), 2) for j in range(0, len(v), 10)])
        if k in r.get("device_allocs", {}):     # the first passes one by one, with their new allocations
            print("     first", [round(x, 1) for x in v[:10]], "allocs", r["device_allocs"][k][:11])
keys = ("model", "forward_s", "record_s", "record_x", "record_landed_x", "capture_s", "pass_fast_s", "pass_fast_x",
        "pass_fast_setup_x", "pass_full_x", "pass_full_setup_x", "replay_warm_s", "golden_gb", "capture_host_growth_gib", "replay_passed", "error")
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.json")):
    for r in json.load(open(f))["rows"]:
        print({k: (round(r[k], 4) if isinstance(r[k], float) else r[k]) for k in keys if k in r})
PY

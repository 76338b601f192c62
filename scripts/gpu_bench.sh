#!/usr/bin/env bash
# The GPU figures of docs/performance.md, on a CUDA or ROCm machine: the environment, the tests marked
# `gpu`, the capture/replay benchmark (tiny and the 1.1B Llama shape, bf16, 4 x 512), the replay's fast
# path with each optimisation it keeps against the path it replaced and a cold replay in a new process,
# and the statistics kernel's routes. Needs torch (CUDA or ROCm build), triton, transformers; no network.
# Usage: OUT=/some/dir bash scripts/gpu_bench.sh [--8b]     (under 10 minutes on an H200; --8b adds
# the 8B Llama shape's capture/replay row, about 3 more)
# Writes to OUT: env.txt, gpu_tests.log, bench.log, bench_parity.json, replay.json, stats_kernel.json,
# fp8_gemm.json (the FP8 emulation against the device's GEMM), profiles.txt (cProfiles of one 1.1B
# fast pass and of a cold replay in a new process); bench.log also holds the FP8 example's replay on the device.
set -uo pipefail
: "${OUT:?set OUT to an output folder}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
models="tiny,1b"
[[ "${1:-}" == --8b ]] && models="tiny,1b,8b"
status=0

{
  date -u
  git rev-parse HEAD 2>/dev/null || true
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || rocm-smi --showproductname 2>/dev/null || true
  python -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'hip', getattr(torch.version, 'hip', None), 'triton', triton.__version__, 'transformers', transformers.__version__)"
  echo "host cores $(nproc)"
} > "$OUT/env.txt" 2>&1

PARITY_GPU_RECORD="$OUT/migrations.jsonl" timeout 400 python -m pytest -q -p no:cacheprovider -m gpu tests > "$OUT/gpu_tests.log" 2>&1 || status=1
{
  timeout 600 python bench/bench_parity.py --device cuda --models "$models" --reps 15 --out "$OUT/bench_parity.json" || status=1
  timeout 300 python bench/bench_replay.py --device cuda --model 1b --reps 21 --profile-dir "$OUT" --out "$OUT/replay.json" || status=1
  timeout 200 python bench/bench_stats_kernel.py --model 1b --no-sweep --out "$OUT/stats_kernel.json" || status=1
  timeout 60 python bench/bench_stats_kernel.py --model 1b --table-cost || status=1
  timeout 60 python bench/fp8_gemm.py > "$OUT/fp8_gemm.json" || status=1
  # the FP8 example golden replayed on the device that captured it (its OCP checkpoint as it is)
  timeout 200 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin --rocm-parity \
    conftest_examples/test_bytellama_fp8.py || status=1
} > "$OUT/bench.log" 2>&1

cat "$OUT/env.txt"
tail -n 3 "$OUT/gpu_tests.log"
python - "$OUT" <<'PY'
import json, os, sys
keys = ("model", "forward_s", "record_x", "capture_s", "capture_host_growth_gib", "golden_gb", "replay_cold_s",
        "replay_warm_s", "load_s", "pass_fast_x", "pass_full_x", "replay_passed", "error",
        "pass_x", "pass_again_x", "preload_s", "lazy_s", "read_s", "hash_s", "floor_s", "cold_s", "cold_cached_s",
        "warm_s", "cold_cached_over_floor_forwards")
for name in ("bench_parity.json", "replay.json"):
    try:
        rows = json.load(open(os.path.join(sys.argv[1], name)))["rows"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"{name}: no rows ({exc})")
        continue
    for r in rows:
        print({k: (round(r[k], 4) if isinstance(r[k], float) else r[k]) for k in keys if k in r})
try:
    print("statistics routes (ms):", json.load(open(os.path.join(sys.argv[1], "stats_kernel.json")))["paths_ms"])
except (OSError, ValueError, KeyError) as exc:
    print(f"stats_kernel.json: {exc}")
PY
echo "exit status $status"
exit $status

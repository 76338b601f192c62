#!/usr/bin/env bash
# The GPU figures of docs/performance.md, on a CUDA or ROCm machine: the environment, the tests marked
# `gpu`, the capture/replay benchmark (tiny and the 1.1B Llama shape, bf16, 4 x 512) and the
# statistics kernel's launch shapes. Needs torch (CUDA or ROCm build), triton, transformers; no network.
# Usage: OUT=/some/dir bash scripts/gpu_bench.sh [--8b]     (under 10 minutes on an H200; --8b adds
# the 8B Llama shape's row, about 3 more)
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
timeout 600 python bench/bench_parity.py --device cuda --models "$models" --reps 15 --out "$OUT/bench_parity.json" \
  > "$OUT/bench_parity.log" 2>&1 || status=1
timeout 200 python bench/bench_stats_kernel.py --model 1b --out "$OUT/stats_kernel.json" > "$OUT/stats_kernel.log" 2>&1 || status=1

cat "$OUT/env.txt"
tail -n 3 "$OUT/gpu_tests.log"
python - "$OUT/bench_parity.json" <<'PY'
import json, sys
keys = ("model", "forward_s", "record_x", "capture_s", "capture_host_growth_gib", "golden_gb", "replay_cold_s",
        "replay_warm_s", "load_s", "pass_fast_x", "pass_full_x", "replay_passed", "error")
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except (OSError, ValueError, KeyError) as exc:
    sys.exit(f"no benchmark rows: {exc}")
for r in rows:
    print({k: (round(r[k], 4) if isinstance(r[k], float) else r[k]) for k in keys if k in r})
PY
echo "exit status $status"
exit $status

#!/usr/bin/env bash
# Issue 8 on the NVIDIA reference: the GPU tests of the fast capture and queued replay, then the
# capture/replay benchmark (tiny and 1.1B, then 8B). Results under $OUT; run from the repo root.
set -uo pipefail
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
L="$OUT"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"; } > "$L/env.txt" 2>&1
part="${1:-all}"
if [[ "$part" == all || "$part" == a ]]; then
  timeout 150 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu tests/unit/test_capture_fast.py \
    -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"
  timeout 330 python bench/bench_parity.py --device cuda --models tiny,1b --reps 10 --profile-dir "$L" --out "$L/bench_tiny_1b.json" > "$L/bench_tiny_1b.log" 2>&1
  echo "bench tiny,1b rc=$?" >> "$L/env.txt"
fi
if [[ "$part" == c ]]; then   # the GPU tests and all three models' benchmark in one call
  timeout 150 python -m pytest -q -p no:cacheprovider -p pytest_rocm_parity.plugin -m gpu tests/gpu tests/unit/test_capture_fast.py \
    -o addopts="" > "$L/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$L/env.txt"
  timeout 400 python bench/bench_parity.py --device cuda --models tiny,1b,8b --reps 10 --profile-dir "$L" --out "$L/bench_all.json" > "$L/bench_all.log" 2>&1
  echo "bench tiny,1b,8b rc=$?" >> "$L/env.txt"
fi
if [[ "$part" == all || "$part" == b ]]; then
  timeout 420 python bench/bench_parity.py --device cuda --models 8b --reps 3 --out "$L/bench_8b.json" > "$L/bench_8b.log" 2>&1
  echo "bench 8b rc=$?" >> "$L/env.txt"
  OUT="$L" timeout 150 bash scripts/gpu_session2.sh
fi
cat "$L/env.txt"
tail -3 "$L/gpu_tests.log" 2>/dev/null
python - "$L" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.json")):
    for r in json.load(open(f))["rows"]:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
PY

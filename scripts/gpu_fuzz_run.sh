#!/usr/bin/env bash
# Operator fuzzing on a real GPU: the Triton RMSNorm kernel natively, then the
# built-in op suite on cuda, then the op suite replaying goldens recorded on this machine.
# Needs torch (CUDA or ROCm build), triton, hypothesis, safetensors; no network.
# Usage: OUT=/some/dir bash scripts/gpu_fuzz_run.sh        (about 2 minutes on an H200)
set -uo pipefail
: "${OUT:?set OUT to an output folder}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
status=0

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || rocm-smi 2>/dev/null || true
  python - <<'EOF'
import torch, hypothesis
try:
    import triton; tv = triton.__version__
except ImportError:
    tv = "not installed"
print(f"torch {torch.__version__} cuda {torch.version.cuda} hip {getattr(torch.version, 'hip', None)} "
      f"triton {tv} hypothesis {hypothesis.__version__}")
print("device:", torch.cuda.get_device_name() if torch.cuda.is_available() else "NO GPU VISIBLE")
EOF
} > "$OUT/env.txt" 2>&1

# 1. Triton kernel, native (no interpreter), 200 examples per test
timeout 150 python -m pytest conftest_examples/test_triton_fuzz.py -p no:rocm_parity -p no:cacheprovider \
  -q -rxs -s > "$OUT/triton_fuzz.log" 2>&1 || status=1

# 2. the op suite on cuda: all operators, fp32/fp16/bf16
timeout 150 python -m pytest_rocm_parity.fuzz.opsuite --device cuda --max-examples 20 --json \
  > "$OUT/ops_cuda.json" 2> "$OUT/ops_cuda.stderr" || status=1

# 3. record goldens here (the "reference machine"), replay them: same inputs, stored truth
timeout 90 python -m pytest_rocm_parity.fuzz.opsuite --device cuda --max-examples 8 --dtypes float16,bfloat16 \
  --record "$OUT/goldens" > "$OUT/ops_record.log" 2>&1 || status=1
timeout 90 python -m pytest_rocm_parity.fuzz.opsuite --device cuda --max-examples 4 --dtypes float16,bfloat16 \
  --replay "$OUT/goldens" > "$OUT/ops_replay.log" 2>&1 || status=1

echo "exit status $status" >> "$OUT/env.txt"
tail -n 3 "$OUT/triton_fuzz.log" "$OUT/ops_record.log" "$OUT/ops_replay.log"
exit $status

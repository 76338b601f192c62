#!/usr/bin/env bash
# Short follow-up run on the NVIDIA reference: verify the cumsum error-model fix and the profiler's
# CUDA path, try to shrink the SDPA misaligned-address case, and time sketch goldens at 1.1B.
set -uo pipefail
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
L="$OUT"
timeout 40 python -m pytest_rocm_parity.opsuite --device cuda --ops cumsum --max-examples 40 > "$L/ops_cumsum.log" 2>&1
echo "cumsum rc=$?" >> "$L/env.txt"
timeout 30 python - > "$L/profile_cuda.log" 2>&1 <<'PY'
import torch
from torch import nn
from pytest_rocm_parity.profiling import profile_shares
m = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).cuda().eval()
x = torch.randn(64, 512, device="cuda")
print(profile_shares(m, (x,), {}, "cuda"))
PY
echo "profile rc=$?" >> "$L/env.txt"
timeout 60 python bench/bench_parity.py --device cuda --models 1b --sketch 512 --reps 3 --out "$L/bench_1b_sketch.json" > "$L/bench_1b_sketch.log" 2>&1
echo "sketch rc=$?" >> "$L/env.txt"
timeout 40 python -m pytest_rocm_parity.opsuite --device cuda --ops sdpa --dtypes bfloat16 --max-examples 150 > "$L/ops_sdpa.log" 2>&1
echo "sdpa rc=$?" >> "$L/env.txt"

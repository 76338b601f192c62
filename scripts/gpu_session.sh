#!/usr/bin/env bash
# One batched run on the NVIDIA reference (device tool): capture the example goldens, replay them
# on the GPU itself, fuzz the Triton kernel natively, benchmark capture/replay. Writes under $OUT:
# goldens/<name>/<files> (committed to conftest_examples/goldens) and logs.tgz.
set -uo pipefail
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 CI=
W=$(mktemp -d); L="$W/logs"; mkdir -p "$L"
snap() { tar czf "$OUT/logs.tgz" -C "$W" logs; }
P="-p pytest_rocm_parity.plugin -p no:cacheprovider"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python -c "import torch, transformers, safetensors; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'safetensors', safetensors.__version__)"; } > "$L/env.txt" 2>&1
rm -rf conftest_examples/goldens
SECONDS=0
timeout 150 python -m pytest $P -q --rocm-parity --parity-mode=capture --parity-device=cuda \
  conftest_examples/test_bytellama_parity.py > "$L/capture.log" 2>&1; echo "capture rc=$? ${SECONDS}s" >> "$L/times.txt"
mkdir -p "$OUT/goldens" && cp -r conftest_examples/goldens/* "$OUT/goldens/"; snap
timeout 90 python -m pytest $P -q --rocm-parity --parity-device=cuda --parity-report="$L/gpu-replay" \
  conftest_examples/test_bytellama_parity.py > "$L/replay_gpu.log" 2>&1; echo "replay rc=$? ${SECONDS}s" >> "$L/times.txt"
snap
timeout 100 env OUT="$L/fuzz" bash scripts/gpu_fuzz_run.sh > "$L/fuzz.log" 2>&1; echo "fuzz rc=$? ${SECONDS}s" >> "$L/times.txt"; snap
timeout 120 python bench/bench_parity.py --device cuda --models tiny,1b --out "$L/bench_small.json" > "$L/bench_small.log" 2>&1
echo "bench small rc=$? ${SECONDS}s" >> "$L/times.txt"; snap
timeout 170 python bench/bench_parity.py --device cuda --models 8b --reps 3 --out "$L/bench_8b.json" > "$L/bench_8b.log" 2>&1
echo "bench 8b rc=$? ${SECONDS}s" >> "$L/times.txt"
snap

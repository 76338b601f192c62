#!/usr/bin/env bash
# One-time setup for a fresh machine (CI and the README's two commands).
# Installs the CPU build of torch unless a torch is already there: GPU users install their
# CUDA or ROCm build of torch first (README, "Installing on a GPU machine").
set -euo pipefail
export PIP_DISABLE_PIP_VERSION_CHECK=1
# System tools the tests exercise: rocminfo/rocm-smi (the doctor's no-GPU path), chromium (HTML report).
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  need=""
  command -v rocminfo >/dev/null 2>&1 || need="$need rocminfo"
  command -v rocm-smi >/dev/null 2>&1 || need="$need rocm-smi"
  command -v chromium >/dev/null 2>&1 || need="$need chromium"
  if [ -n "$need" ]; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
  fi
fi
if ! python -c "import torch" 2>/dev/null; then
  # PyPI's torch for Linux is the CUDA build (gigabytes of nvidia-* wheels): the CPU build comes from
  # PyTorch's own index, and from the package mirror where that index cannot be reached
  python -m pip install -q --timeout 10 --retries 0 "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
    || python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[test]"
# Triton runs the example kernel through its interpreter on the CPU (TRITON_INTERPRET=1); GPU users
# keep the triton their torch build pins.
if ! python -c "import triton" 2>/dev/null && [ "$(uname -m)" = x86_64 ]; then
  python -m pip install -q "triton==3.9.0"
fi

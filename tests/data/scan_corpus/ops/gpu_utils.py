"""Device helpers written for NVIDIA machines."""
import subprocess

import pynvml  # expect: RP215
import torch
from flash_attn import flash_attn_func  # expect: RP210
from flash_attn_interface import flash_attn_func as fa3  # expect: RP211
import xformers.ops  # expect: RP212
from apex.normalization import FusedLayerNorm  # expect: RP213
import bitsandbytes as bnb  # expect: RP214
from mamba_ssm import Mamba  # expect: RP216
import cupy as cp  # expect: RP217

kernel = cp.RawKernel(r"extern \"C\" __global__ void k(float* x) { x[threadIdx.x] = 0; }", "k")  # expect: RP202 RP125


def use_fa3() -> bool:
    return torch.cuda.get_device_capability() >= (9, 0)  # expect: RP220


def is_hopper() -> bool:
    return "H100" in torch.cuda.get_device_name(0)  # expect: RP221


def is_nvidia() -> bool:
    return torch.cuda.get_device_name().startswith("NVIDIA")  # expect: RP221


def cuda_major() -> int:
    return int(torch.version.cuda.split(".")[0])  # expect: RP222


def is_rocm() -> bool:
    return torch.version.hip is not None and torch.version.cuda is None


def gpu_memory() -> str:
    return subprocess.check_output(["nvidia-smi", "--query-gpu=memory.used", "--format=csv"]).decode()  # expect: RP215


def cudnn_is_new() -> bool:
    return torch.backends.cudnn.version() >= 8900  # expect: RP223


def fast_fp32() -> None:
    torch.backends.cuda.matmul.fp32_precision = "bfx9"  # expect: RP224


def has_tma() -> bool:
    return torch.cuda.get_device_properties(0).major >= 9  # expect: RP220


def use_wgmma() -> bool:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return props.major == 9 and props.minor == 0  # expect: RP220


def python_is_new() -> bool:
    import sys
    return sys.version_info.major >= 3

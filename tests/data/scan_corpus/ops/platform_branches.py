"""Code that already branches on ROCm: its non-ROCm branches are fine as they are."""
import torch
from vllm.platforms import current_platform

is_rocm = torch.version.hip is not None
cuda_ver = None if is_rocm else torch.version.cuda
CUDA_MAJOR = int(torch.version.cuda.split(".")[0]) if not is_rocm else 0

if torch.version.hip:
    WARP_SIZE = 64
else:
    WARP_SIZE = 32

if not current_platform.is_rocm():
    import pynvml
    THREADS_PER_WARP = 32

if torch.version.hip is None and torch.cuda.is_available():
    ARCH = torch.version.cuda

if torch.cuda.is_available():
    warp_size = 32  # expect: RP208

torch.backends.cudnn.allow_tf32 = True
torch.backends.cudnn.conv.fp32_precision = "tf32"
torch.backends.cuda.matmul.allow_tf32 = True  # expect: RP228

"""JIT-compiled CUDA extension with an embedded kernel."""
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <cuda_bf16.h>  // expect: RP119
__global__ void scale_kernel(float* x, float s, int n) {  // expect: RP125
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned lane = threadIdx.x % 32;  // expect: RP105
  float v = __shfl_sync(0xffffffff, x[i], 0);  // expect: RP101
  if (i < n) x[i] = v * s + lane * 0;
}
"""

module = load_inline(  # expect: RP201
    name="scale_ext",
    cpp_sources="void scale(torch::Tensor x, double s);",
    cuda_sources=cuda_source,
    extra_cuda_cflags=["--use_fast_math", "-gencode=arch=compute_80,code=sm_80"],  # expect: RP226
)

// A kernel already ported: 64-bit masks, guarded constants, comments that mention CUDA-isms.
#include <hip/hip_runtime.h>

#ifdef USE_ROCM
constexpr int kWarpSize = 64;
#define FULL_MASK64 0xffffffffffffffffull
#else
constexpr int kWarpSize = 32;  // the CUDA branch of #ifdef USE_ROCM: not flagged
#endif

// Old code used __shfl_xor_sync(0xffffffff, v, m) with lane = tid & 31; kept as a note.
/* asm volatile("mov.u32 %0, %%laneid;") was replaced. */

__device__ float reduce(float v) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) {
    v += __shfl_xor_sync(0xffffffffffffffffull, v, m);
  }
  return v;
}

__device__ int votes(bool p) {
  uint64_t b = __ballot(p);
  return __popcll(b);
}

#if defined(USE_ROCM) || CUDA_VERSION >= 11000
#define HAS_BF16 1
#endif

// One source for both platforms: the CUDA branches of ROCm conditionals are fine as they are.
#include <hip/hip_runtime.h>

#ifdef USE_ROCM
#define WARP_SIZE 64
#else
#define WARP_SIZE 32
#endif

#if defined(__HIP_PLATFORM_AMD__) || defined(USE_ROCM)
constexpr int kLanes = 64;
#elif CUDA_VERSION >= 12000
constexpr int kWarpSize = 32;
#else
constexpr int kWarpSize = 32;
#endif

#if !defined(USE_ROCM)
__device__ float bcast(float v) { return __shfl_sync(0xffffffff, v, 0); }
#endif

#if defined(USE_ROCM) && defined(FAST_PATH)
#define TILE 64
#else
#define THREADS_PER_WARP 32  // expect: RP104 (the else also runs on ROCm without FAST_PATH)
#endif

#ifdef ENABLE_BF16
constexpr int kWarpSizeBf16 = 32;  // expect: RP104
#endif

__device__ float red(float v) {
  for (int m = WARP_SIZE / 2; m > 0; m >>= 1)
    v += __shfl_xor_sync(  // expect: RP101 (mask on the next line: one finding, not RP102 too)
        0xffffffff, v, m);
  return v;
}

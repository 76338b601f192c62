// Vendored: must be skipped by default.
#define WARP_SIZE 32
__device__ float f(float v) { return __shfl_xor_sync(0xffffffff, v, 1); }

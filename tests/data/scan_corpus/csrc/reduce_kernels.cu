// Block reductions in the style of vLLM's reduction_utils.cuh before the ROCm fix.
#include <cuda_runtime.h>
#include <cuda_fp16.h>  // expect: RP119
#include <cub/cub.cuh>  // expect: RP117

#define WARP_SIZE 32  // expect: RP104
#define FINAL_MASK 0xffffffff

__inline__ __device__ float warpReduceSum(float val) {
  for (int mask = 16; mask > 0; mask >>= 1)  // expect: RP106
    val += __shfl_xor_sync(0xffffffff, val, mask, 32);  // expect: RP101 RP107
  return val;
}

__inline__ __device__ float warpReduceMax(float val) {
  for (int offset = 16; offset > 0; offset /= 2) {  // expect: RP106
    val = fmaxf(val, __shfl_down_sync(FINAL_MASK, val, offset));  // expect: RP101
  }
  return val;
}

__inline__ __device__ float blockReduceSum(float val) {
  static __shared__ float shared[32];
  int lane = threadIdx.x & 0x1f;  // expect: RP105
  int wid = threadIdx.x >> 5;  // expect: RP105
  val = warpReduceSum(val);
  if (lane == 0) shared[wid] = val;
  __syncthreads();
  val = (threadIdx.x < (blockDim.x / 32.f)) ? shared[lane] : 0.f;  // expect: RP105 (known miss)
  return warpReduceSum(val);
}

__device__ int count_active(bool pred) {
  unsigned int votes = __ballot_sync(0xFFFFFFFFu, pred);  // expect: RP101 RP103
  return __popc(__ballot_sync(uint32_t(-1), pred));  // expect: RP101 RP103
}

__device__ bool all_ok(bool p) {
  __syncwarp();  // expect: RP113
  return __all_sync(__activemask(), p);
}

__device__ float cached_load(const float* p) { return __ldg(p); }  // expect: RP124

template <int N = warpSize>  // expect: RP108
struct Tile {};
constexpr int kLanes = warpSize;  // expect: RP108
Tile<warpSize> tile;  // expect: RP108

__global__ void rms_norm_kernel(float* out, const float* in, int n) {  // expect: RP125
  const int tid = threadIdx.x;
  const int warp = tid / 32;  // expect: RP105
  float v = in[blockIdx.x * n + tid];
  float s = blockReduceSum(v * v);
  out[blockIdx.x * n + tid] = v * rsqrtf(s / n + 1e-6f) + warp * 0;
}

void launch(float* out, const float* in, int n, cudaStream_t stream) {
  rms_norm_kernel<<<n, 256, 0, stream>>>(out, in, n);
}

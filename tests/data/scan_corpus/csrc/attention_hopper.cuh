#pragma once
#include <cuda.h>
#include <cuda_fp8.h>  // expect: RP120
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>  // expect: RP114
#include <mma.h>  // expect: RP111

namespace cg = cooperative_groups;
using namespace nvcuda;

__device__ float tile_sum(cg::thread_block_tile<32> g, float v) {
  return cg::reduce(g, v, cg::plus<float>());  // expect: RP114
}

__device__ void mma_tile(const half* a, const half* b, float* c) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;  // expect: RP111
  wmma::load_matrix_sync(fa, a, 16);  // expect: RP111
}

__device__ uint32_t lane_id() {
  uint32_t lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));  // expect: RP110
  return lane;
}

__device__ void ldsm(uint32_t addr, uint32_t* r) {
  asm volatile(  // expect: RP110
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ void tma_load(const CUtensorMap* desc, void* smem, int x) {  // expect: RP112
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile [%0], [%1, {%2, 0}];"  // expect: RP110 RP112
               :: "r"(smem), "l"(desc), "r"(x));
}

__device__ void fp8_convert(__nv_fp8_e4m3* out, float v) { *out = __nv_fp8_e4m3(v); }  // expect: RP120

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // expect: RP122
#define HAS_WGMMA 1
#endif

#if CUDA_VERSION >= 12000  // expect: RP121
#define HAS_TMA 1
#endif

template <typename Kernel>
void set_smem(Kernel k, int bytes) {
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);  // expect: RP115
}

#include <cublasLt.h>  // expect: RP117
#include <cudnn_frontend.h>  // expect: RP118
#include <cutlass/cutlass.h>  // expect: RP116
#include <cutlass/gemm/device/gemm.h>  // expect: RP116
#include <cute/tensor.hpp>  // expect: RP116
#include <thrust/device_vector.h>  // expect: RP117

using namespace cute;  // expect: RP116

texture<float, 1, cudaReadModeElementType> tex_ref;  // expect: RP123

void run_gemm(cublasLtHandle_t h) {
  using Gemm = cutlass::gemm::device::Gemm<float, cutlass::layout::RowMajor, float,
                                           cutlass::layout::RowMajor, float, cutlass::layout::RowMajor>;
  Gemm gemm_op;
  (void)gemm_op;
}

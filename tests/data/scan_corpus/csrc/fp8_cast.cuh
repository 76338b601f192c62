// Saturating FP8 cast for Hopper.
#pragma once
#include <cuda_fp8.h>  // expect: RP120

constexpr float kFp8E4m3Max = 448.0f;  // expect: RP227

__device__ __forceinline__ __nv_fp8_e4m3 to_fp8(float v, float inv_scale) {  // expect: RP120
  const float s = fminf(fmaxf(v * inv_scale, -448.f), 448.f);  // expect: RP227
  return __nv_fp8_e4m3(s);  // expect: RP120
}

#pragma once
#include <cstdint>

namespace kern {
constexpr int kWarpSize = 32;  // expect: RP104
static constexpr unsigned THREADS_PER_WARP = 32;  // expect: RP104
#define WARP 32  // expect: RP104 (known miss: no SIZE in the name)
inline int lanes_per_block(int warps) { return warps * WARP; }

// Host-only inline asm for x86 must not be reported as PTX.
inline void cpu_relax() { __asm__ __volatile__("pause"); }
}  // namespace kern

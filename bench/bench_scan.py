"""Scan throughput benchmark: prints lines/s for ``rocm-parity scan`` on a generated corpus.

The corpus mixes CUDA/C++ and Python files that look like real extension code (includes,
kernels, launches, comments, Triton) with a few findings per file, so both the keyword
gate and the regexes are exercised.  Run: ``python bench/bench_scan.py [--lines N]``.
The target is >= 50,000 lines/s on one core. ``--long-lines`` times every rule on
long adversarial lines instead (linear rules: about 4x per 4x longer line).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from pytest_rocm_parity.migration.scan import scan_path

CUDA_BLOCK = """\
// Fused kernel {i}: layer norm followed by a residual add.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
template <typename T, int BLOCK>
__global__ void fused_kernel_{i}(T* __restrict__ out, const T* __restrict__ in, const T* gamma, int n) {{
  const int row = blockIdx.x;
  float acc = 0.f;
  for (int c = threadIdx.x; c < n; c += blockDim.x) {{
    float v = static_cast<float>(in[row * n + c]);
    acc += v * v;
  }}
  acc = warp_reduce(acc);
  if (threadIdx.x == 0) {{ shared_acc[row % 4] = acc; }}
  __syncthreads();
  const float inv = rsqrtf(shared_acc[row % 4] / n + 1e-6f);
  for (int c = threadIdx.x; c < n; c += blockDim.x) {{
    out[row * n + c] = static_cast<T>(static_cast<float>(in[row * n + c]) * inv * static_cast<float>(gamma[c]));
  }}
}}
void launch_{i}(half* out, const half* in, const half* g, int rows, int n, cudaStream_t s) {{
  fused_kernel_{i}<half, 256><<<rows, 256, 0, s>>>(out, in, g, n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}}
"""
CUDA_FINDINGS = """\
#define WARP_SIZE 32
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
"""
PY_BLOCK = """\
def forward_{i}(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    \"\"\"Apply block {i}: norm, projection, activation and residual.\"\"\"
    h = self.norm_{i}(x)
    h = torch.nn.functional.linear(h, self.weight_{i}, self.bias_{i})
    h = torch.nn.functional.gelu(h, approximate="tanh")
    if residual is not None:
        h = h + residual
    # keep the activations for the backward pass
    self.saved_{i} = h.detach()
    return h

"""
PY_FINDINGS = """\
import flash_attn
@triton.jit
def kernel(x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
"""


def make_corpus(root: Path, target_lines: int) -> int:
    """Write files until ``target_lines`` lines exist; returns the line count written."""
    written, f = 0, 0
    while written < target_lines:
        if f % 2 == 0:
            text = CUDA_FINDINGS + "".join(CUDA_BLOCK.format(i=i) for i in range(40))
            path = root / "csrc" / f"kernels_{f}.cu"
        else:
            text = "import torch\nimport triton\n" + PY_FINDINGS + "".join(PY_BLOCK.format(i=i) for i in range(80))
            path = root / "model" / f"layers_{f}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written += text.count("\n")
        f += 1
    return written


def long_lines(lengths: tuple[int, ...] = (32_768, 131_072, 524_288)) -> None:
    """Seconds to scan one line of each length, per rule, on the shapes that make a regex backtrack:
    the rule's own anchors and tokens repeated. Linear rules grow 4x per row; the worst rule is printed."""
    import re

    from pytest_rocm_parity.migration import scan

    seps = (" ", " (", "(a", ", ")
    print(f"{'rule':<7}{'worst unit':<28}" + "".join(f"{n // 1024:>9} KiB" for n in lengths) + "   growth per 4x")
    for rule in scan.RULES:
        words = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]{2,}", rule.pattern.replace("(?i:", "(")))
        frags = sorted(set(rule.keywords) | words | {"const", "static", "#define", "warp_size"})
        kinds = scan.P if rule.kinds == scan.P else scan.D
        head = "MaxDynamicSharedMemorySize warpSize\n"
        worst: tuple[float, str] = (0.0, "")
        for unit in (f + s for f in frags for s in seps):   # pick the slowest unit at the middle length
            line = (unit * (lengths[1] // len(unit) + 1))[:lengths[1]]
            t0 = time.process_time()
            scan.scan_text(head + line + "\n", "x", kinds, (rule,))
            worst = max(worst, (time.process_time() - t0, unit))
        unit = worst[1]
        row = []
        for n in lengths:
            line = (unit * (n // len(unit) + 1))[:n]
            t0 = time.process_time()
            scan.scan_text(head + line + "\n", "x", kinds, (rule,))
            row.append(time.process_time() - t0)
        growth = (row[-1] / row[0]) ** (1 / (len(row) - 1)) if row[0] > 0 else 0.0
        print(f"{rule.id:<7}{unit[:26]!r:<28}" + "".join(f"{t:>13.4f}" for t in row) + f"   {growth:>6.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=500_000, help="corpus size in lines (default 500,000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    parser.add_argument("--long-lines", action="store_true",
                        help="instead: CPU seconds per rule for one adversarial line of 32 KiB, 128 KiB and 512 KiB")
    args = parser.parse_args()
    if args.long_lines:
        long_lines()
        return
    with tempfile.TemporaryDirectory() as tmp:
        lines = make_corpus(Path(tmp), args.lines)
        best, best_cpu = float("inf"), float("inf")
        findings = 0
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            result = scan_path(tmp)
            best = min(best, time.perf_counter() - t0)
            best_cpu = min(best_cpu, time.process_time() - c0)
            findings = len(result.findings)
        print(f"{result.files} files, {lines} lines, {findings} findings, best of {args.repeat}: "
              f"wall {best:.3f}s = {lines / best:,.0f} lines/s, CPU {best_cpu:.3f}s = {lines / best_cpu:,.0f} lines/s "
              f"(one core, hipify report off)")


if __name__ == "__main__":
    main()

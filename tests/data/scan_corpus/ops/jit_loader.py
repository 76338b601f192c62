"""CUDA extensions built at import time through torch's JIT loader, imported the usual ways."""
import torch
import torch.utils.cpp_extension as ce  # expect: RP201
from torch.utils import cpp_extension as cppe  # expect: RP201
from torch.utils.cpp_extension import load  # expect: RP201

fused = load(name="fused_norm", sources=["fused_norm.cpp", "fused_norm_kernel.cu"])
rope = ce.load(name="rope", sources=["rope.cu"])
gemm = cppe.load(name="gemm", sources=["gemm.cu"])
weights = torch.load("weights.pt", weights_only=True)

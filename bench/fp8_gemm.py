"""How far quant.fp8's exact emulation is from the device's own FP8 GEMM (torch._scaled_mm): run on a
GPU with FP8 matrix cores; docs/fp8.md records the result.

    python bench/fp8_gemm.py > fp8_gemm.json
"""
import torch, json, sys
from torch import nn
from pytest_rocm_parity.quant.fp8 import Fp8Linear, _native_gemm
torch.manual_seed(0)
lin = nn.Linear(256, 384).cuda()
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
for act in ("token", "tensor"):
    q = Fp8Linear.from_linear(lin, "e4m3fn", "channel", act).cuda()
    x = torch.randn(192, 256, device="cuda", dtype=torch.bfloat16)
    codes, s = q.quantize_input(x.float())
    native = q._gemm(codes, s, torch.bfloat16, torch.float32)
    emul = ((codes.float() @ q.weight.float().t()) * s * q.weight_scale.reshape(1, -1)).to(torch.bfloat16)
    rel = ((native.float() - emul.float()).norm() / emul.float().norm()).item()
    out[act] = {"native_gemm_used": bool(_native_gemm(codes, q.weight, torch.bfloat16)),
                "max_abs_native_vs_emulation_bf16": (native.float() - emul.float()).abs().max().item(),
                "rel_native_vs_emulation": rel,
                "bf16_ulps_differing_frac": (native != emul).float().mean().item()}
json.dump(out, sys.stdout, indent=1)

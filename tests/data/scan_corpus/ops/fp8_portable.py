"""FP8 quantization that follows the device's format: must produce no finding."""
import torch


def fp8_dtype() -> torch.dtype:
    props = torch.cuda.get_device_properties(0)
    fnuz = getattr(props, "gcnArchName", "").startswith("gfx94")
    return torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn


def per_tensor_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = fp8_dtype()
    fp8_max = torch.finfo(dtype).max
    scale = x.abs().amax().clamp(min=1e-12) / fp8_max
    return (x / scale).clamp(-fp8_max, fp8_max).to(dtype), scale


def to_fnuz(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP bytes read as FNUZ mean half the value: the scale doubles, and 0x80 (NaN in FNUZ) becomes 0."""
    bits = weight.view(torch.int8).clone()
    bits[bits == -128] = 0
    return bits.view(torch.float8_e4m3fnuz), scale * 2.0

"""Vendor-neutral code that must produce no finding."""
import torch

# We used to `import pynvml` and check torch.cuda.get_device_capability() here.
FLOAT8 = getattr(torch, "float8_e4m3fnuz", None)


def backend() -> str:
    if torch.version.hip is not None:
        return "rocm"
    return "cuda" if torch.cuda.is_available() else "cpu"


def warp_size() -> int:
    props = torch.cuda.get_device_properties(0)
    return getattr(props, "warp_size", 64)

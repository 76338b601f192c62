"""Lane bookkeeping on the host that mirrors the __device__ helper in the kernel file (warp_sum)."""


def lane_of(tid: int) -> int:
    return tid & 31

from numba import cuda  # expect: RP203
import pycuda.autoinit  # expect: RP204


@cuda.jit  # expect: RP203
def add(a, b, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] + b[i]

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="kernels",
    ext_modules=[
        CUDAExtension(  # expect: RP201
            "kernels._C",
            ["csrc/reduce_kernels.cu", "csrc/gemm_cutlass.cu"],
            extra_compile_args={"nvcc": ["-O3", "--expt-relaxed-constexpr", "-Xptxas=-v"]},  # expect: RP226
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)

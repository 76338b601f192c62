"""FP8 quantization: the FP8 formats (OCP and FNUZ) and which devices compute in which."""

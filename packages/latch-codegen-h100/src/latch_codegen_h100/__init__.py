"""Latch H100/H200 code generation, ninja/nvcc build, ctypes runtime."""

"""CUDA op bodies (.cuh device templates) of the core vocabulary; package data, found by
latch_codegen_h100 through ``Path(latch_ops.__file__).parent / "cuda"``."""

"""Latch check: FP64 reference interpreter, arena simulator, numerical gates, benchmarks."""

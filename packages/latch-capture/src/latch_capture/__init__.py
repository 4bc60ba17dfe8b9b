"""Latch capture: PyTorch training update -> Graph."""

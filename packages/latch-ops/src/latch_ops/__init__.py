"""Latch op definitions: schemas, shape rules, torch references, derivatives, costs, CUDA bodies."""

"""Latch memory: numerical policy, recomputation, liveness, arena planning."""

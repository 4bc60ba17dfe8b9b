"""Latch scheduling: Graph -> Schedule (barrier, dataflow), static hazard validator."""

"""Registrations of the MoE ops through the `moe` entry point."""

from latch_core.hookspecs import hookimpl  # noqa: F401

"""Latch op definitions: schemas, shape rules, torch references, derivatives, costs, CUDA bodies.

Importing latch_ops never imports torch; references import it when they run. The core vocabulary
is :data:`latch_ops.vocabulary.SPECS`; the installed set (core + plugins) is
``latch_core.plugins.registries().ops``.
"""

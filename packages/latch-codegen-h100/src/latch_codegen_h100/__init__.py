"""Latch H100/H200 code generation, ninja/nvcc build, ctypes runtime.

    build(doc, out_dir) -> Document          generate + compile; adds the ``build`` section
    Program.load(build_dir)(params, state, batch, hyper=None) -> loss   (needs torch + a GPU)

Code generation and the build never import torch; ``Program`` (the runtime) does, on first use.
"""

from .bodies import CodegenError
from .builder import BuildError, build
from .codegen import generate
from .lowering import BodyContext, Lowering, LoweringError, NodeInfo, Operand

__all__ = ["build", "generate", "BuildError", "CodegenError", "Lowering", "LoweringError", "BodyContext",
           "NodeInfo", "Operand", "Program", "ProgramError", "LaunchError"]


def __getattr__(name):
    if name in ("Program", "ProgramError", "LaunchError"):
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'latch_codegen_h100' has no attribute {name!r}")

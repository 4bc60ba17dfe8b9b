"""Latch H100/H200 code generation, ninja/nvcc build, ctypes runtime.

    build(doc, out_dir) -> Document          generate + compile; adds the ``build`` section
    Program.load(build_dir)(params, state, batch, hyper=None) -> loss   (needs torch + a GPU)
    sass_report(build_dir / "program.so")   the machine code: HGMMA, UTMALDG, USETMAXREG, spills

This is the package's public API (``[tool.latch] public`` in its pyproject: other packages import
these names, not the modules behind them). Code generation and the build never import torch;
``Program`` (the runtime) does, on first use. Every name loads on first use, so importing the
plugin module stays cheap.
"""

_LAZY = {
    "CodegenError": "bodies", "BuildError": "builder", "build": "builder", "generate": "codegen",
    "BodyContext": "lowering", "Lowering": "lowering", "LoweringError": "lowering", "NodeInfo": "lowering",
    "Operand": "lowering", "Program": "runtime", "ProgramError": "runtime", "LaunchError": "runtime",
    "TensorMap": "lowering", "sass_report": "sass", "SassError": "sass", "check_compiles": "builder",
    "have_nvcc": "builder", "BuildsAhead": "testing",
}

__all__ = ["build", "generate", "BuildError", "CodegenError", "Lowering", "LoweringError", "BodyContext",
           "NodeInfo", "Operand", "Program", "ProgramError", "LaunchError", "TensorMap", "sass_report", "SassError",
           "check_compiles", "have_nvcc", "BuildsAhead"]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'latch_codegen_h100' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

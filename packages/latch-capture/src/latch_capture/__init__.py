"""Latch capture: PyTorch training update -> Graph.

    from latch_capture import capture_module, tensor_update
    doc = capture_module(model, objective, inputs, targets, optimizer=tensor_update(update, init_state=init))

See ``api.py`` (and the package README) for the arguments. The names below load on first use, so
importing ``latch_capture`` (its plugin module, its capture pass) does not import torch.
"""

import warnings

# torch built without numpy warns on import of its functionalization module; nothing here uses numpy
# (numpy is a dependency of this package, so the warning should not appear; this keeps a broken
# numpy install from printing it on every command)
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

_LAZY = {
    "Example": "api", "TensorUpdate": "api", "capture_module": "api", "tensor_update": "api",
    "advance": "binding", "batch_inputs": "binding", "bind_inputs": "binding", "program_inputs": "binding",
    "weight_copies": "binding",
    "CaptureError": "errors", "load_example": "examples",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'latch_capture' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

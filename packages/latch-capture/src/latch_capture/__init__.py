"""Latch capture: PyTorch training update -> Graph.

    from latch_capture import capture_module, tensor_update
    doc = capture_module(model, objective, inputs, targets, optimizer=tensor_update(update, init_state=init))

See ``api.py`` (and the package README) for the arguments.
"""

import warnings

# torch built without numpy warns on import of its functionalization module; nothing here uses numpy
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from .api import Example, TensorUpdate, capture_module, tensor_update
from .binding import advance, batch_inputs, bind_inputs, program_inputs
from .errors import CaptureError
from .examples import load_example

__all__ = [
    "Example", "TensorUpdate", "capture_module", "tensor_update", "advance", "batch_inputs", "bind_inputs",
    "program_inputs", "CaptureError", "load_example",
]

"""latch-core: the Graph IR, the document format, registries, plugins, passes and the CLI.

This package never imports torch.
"""

from .document import SCHEMA_VERSION, Document, DocumentError, Provenance, dumps, load, loads, save
from .ir import (
    BATCH, CONST, DTYPES, HYPER, INTERMEDIATE, PARAM, STATE, Graph, GraphSection, Group, IRError, Node,
    TensorType, Value,
)
from .lint import LintError, lint
from .passes import Pass, PassError, run_pass, run_pipeline
from .registry import OpSpec, Registry, RegistryError, ShapeError

__all__ = [
    "SCHEMA_VERSION", "Document", "DocumentError", "Provenance", "dumps", "load", "loads", "save",
    "BATCH", "CONST", "DTYPES", "HYPER", "INTERMEDIATE", "PARAM", "STATE", "Graph", "GraphSection",
    "Group", "IRError", "Node", "TensorType", "Value", "LintError", "lint", "Pass", "PassError",
    "run_pass", "run_pipeline", "OpSpec", "Registry", "RegistryError", "ShapeError",
]

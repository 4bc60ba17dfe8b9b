"""The gathers' cost (latch_ops.indexing._gather_cost): a gather reads one source element per output
element, so an embedding of a few rows of a large table costs its rows, not the table."""

from __future__ import annotations

from latch_core.ir import TensorType
from latch_ops import indexing


def _cost(op, ins, outs, attrs=None):
    spec = {s.name: s for s in indexing.SPECS}[op]
    return spec.cost(ins, outs, attrs or {})


def test_an_embedding_costs_the_rows_it_reads_not_the_table():
    table, idx = TensorType((49152, 768), "f32"), TensorType((2, 1024), "i64")
    out = TensorType((2, 1024, 768), "f32")
    flops, nbytes = _cost("latch::embedding", [table, idx], [out])
    assert flops == 2 * 1024 * 768
    assert nbytes == 2 * 1024 * 768 * 4 * 2 + 2 * 1024 * 8  # rows read + rows written + the indices
    assert nbytes < table.nbytes / 10


def test_index_select_and_gather_read_one_source_element_per_output_element():
    x, idx = TensorType((4096, 768), "bf16"), TensorType((8192,), "i64")
    out = TensorType((8192, 768), "bf16")
    _, nbytes = _cost("latch::index_select", [x, idx], [out], {"dim": 0})
    assert nbytes == 8192 * 768 * 2 * 2 + 8192 * 8  # more rows out than in: each read once per use
    xs, ids = TensorType((64, 32), "f32"), TensorType((64, 4), "i64")
    o = TensorType((64, 4), "f32")
    _, nb = _cost("latch::gather", [xs, ids], [o], {"dim": 1})
    assert nb == 64 * 4 * 4 * 2 + 64 * 4 * 8

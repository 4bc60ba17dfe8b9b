"""route_order's bodies (cuda/latch_route.cuh) run on the CPU: the header is compiled with g++
against a model of one block (route_emulator/route_model.h: 256 fibers, warp collectives through
per-warp buffers, block barriers) and every output is compared with the reference
(latch_ops.moe.reference.route_order_math) bit for bit: the stable sort of the (token, slot)
pairs by expert, its inverse and the offsets. Shapes: TinyMoE-200M's 2 x 1024 tokens top-2 of 16
experts, 32 x 1024 tokens, pair counts that leave warps partly or wholly without pairs, one
expert, 256 experts (the most route_order_warps takes), skewed routing with experts nobody picks;
route_order_all (beyond 256 experts) on the same cases. An index out of range is reported."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from latch_ops.moe.reference import route_order_math  # noqa: E402
from test_attention_emulated import build_emulator  # noqa: E402

HERE = Path(__file__).parent
CUDA = HERE.parent / "src" / "latch_ops" / "cuda"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return build_emulator(tmp_path_factory.mktemp("emu_route"), CUDA / "latch_route.cuh", "route_emulator.cpp",
                          models=("attention_emulator", "route_emulator"), timeout=600)


def _run(lib, which, idx, E):
    n, k = idx.shape
    idx = idx.contiguous().long()
    token = torch.full((n * k,), -7, dtype=torch.int64)
    pos = torch.full((n * k,), -7, dtype=torch.int64)
    off = torch.full((E + 1,), -7, dtype=torch.int64)
    err = torch.zeros(3, dtype=torch.int64)
    p = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    rc = lib.route_emulated(which, ctypes.c_longlong(n), k, ctypes.c_longlong(E), p(idx), p(token), p(pos), p(off), p(err))
    assert rc == 0, f"the body wrote past its shared memory (code {rc})"
    return token, pos, off, err


def _ids(n, k, E, seed, skew=False):
    g = torch.Generator().manual_seed(seed)
    if skew:  # expert 0 four times as likely, the last expert never picked
        w = torch.tensor([4.0] + [1.0] * (E - 2) + [0.0]) if E >= 2 else torch.ones(1)
        return torch.multinomial(w, n * k, replacement=True, generator=g).view(n, k)
    return torch.randint(0, E, (n, k), generator=g)


CASES = [(2048, 2, 16, False), (2048, 2, 16, True), (32768, 2, 16, True), (1, 1, 1, False), (7, 3, 5, True),
         (100, 2, 256, False), (3000, 2, 33, True), (257, 1, 2, False), (5, 2, 256, True)]


@pytest.mark.parametrize("n,k,E,skew", CASES)
@pytest.mark.parametrize("which", [0, 1], ids=["warps", "all"])
def test_route_order_bodies_equal_the_reference_bit_for_bit(lib, which, n, k, E, skew):
    if which == 1 and n * k > 5000:
        pytest.skip("route_order_all ranks by a scan of its chunk: slow under the model")
    ids = _ids(n, k, E, seed=n + 31 * E, skew=skew)
    token, pos, off, err = _run(lib, which, ids, E)
    assert int(err[0]) == 0, err
    rt, rp, ro = route_order_math(ids, E)
    assert torch.equal(off, ro), (off, ro)
    assert torch.equal(token, rt)
    assert torch.equal(pos, rp)


@pytest.mark.parametrize("which", [0, 1], ids=["warps", "all"])
def test_an_index_out_of_range_is_reported(lib, which):
    ids = _ids(300, 2, 16, seed=3)
    ids[123, 1] = 16
    *_, err = _run(lib, which, ids, 16)
    assert err.tolist() == [4, 16, 16], err  # ERR_INDEX_RANGE, the index, the bound


# ---- the split route_order (latch_ops.moe.route_split): route_count per chunk, then route_place,
# route_rows and route_offsets, each task run as its own block, in chunks and row tiles that do not
# line up with each other, the warps' ranges or the experts' segments

def _run_split(lib, idx, E, chunk, rows):
    n, k = idx.shape
    P = n * k
    C = -(-P // chunk)
    idx = idx.contiguous().long()
    counts = torch.full((C * E,), -7, dtype=torch.int32)
    token, pos, pairs = (torch.full((P,), -7, dtype=torch.int64) for _ in range(3))
    off = torch.full((E + 1,), -7, dtype=torch.int64)
    err = torch.zeros(3, dtype=torch.int64)
    p = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    ll = ctypes.c_longlong
    rc = lib.route_split_emulated(ll(n), k, ll(E), ll(chunk), ll(rows), p(idx), p(counts), p(token), p(pos), p(pairs),
                                  p(off), p(err))
    assert rc == 0, f"a body wrote past its shared memory (code {rc})"
    return counts.view(C, E), token, pos, pairs, off, err


SPLIT_CASES = [(2048, 2, 16, False, 512, 512), (2048, 2, 16, True, 512, 300), (32768, 2, 16, True, 512, 512),
               (1000, 2, 8, False, 256, 97), (7, 3, 5, True, 6, 4), (3000, 2, 33, True, 768, 1000),
               (257, 1, 2, False, 64, 1), (500, 2, 64, True, 256, 128), (300, 2, 16, False, 4096, 600)]


@pytest.mark.parametrize("n,k,E,skew,chunk,rows", SPLIT_CASES)
def test_the_split_route_order_equals_the_reference_bit_for_bit(lib, n, k, E, skew, chunk, rows):
    ids = _ids(n, k, E, seed=n + 7 * E, skew=skew)
    counts, token, pos, pairs, off, err = _run_split(lib, ids, E, chunk, rows)
    assert int(err[0]) == 0, err
    flat = ids.reshape(-1)
    want = torch.stack([torch.bincount(flat[c:c + chunk], minlength=E) for c in range(0, n * k, chunk)])
    assert torch.equal(counts.long(), want)
    rt, rp, ro = route_order_math(ids, E)
    assert torch.equal(off, ro), (off, ro)
    assert torch.equal(token, rt)
    assert torch.equal(pos, rp)
    assert torch.equal(pairs, torch.argsort(rp)), "pairs is the inverse of position"
    assert torch.equal(pairs // k, token)


def test_the_split_route_count_reports_an_index_out_of_range(lib):
    ids = _ids(300, 2, 16, seed=3)
    ids[123, 1] = -1
    *_, err = _run_split(lib, ids, 16, 128, 128)
    assert err.tolist() == [4, -1, 16], err

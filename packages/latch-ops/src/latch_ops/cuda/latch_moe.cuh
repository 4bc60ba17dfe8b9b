// MoE bodies (latch_ops/moe/specs.py): token_topk and its backward, route_order (latch_route.cuh), and the ragged
// matrix products (forward, grad_x, grad_w) over expert segments given by ``offsets`` (data).
//
// Two forms of the ragged products:
// - grouped wgmma (``ragged_produce`` / ``ragged_consume``, ``ragged_w_produce`` /
//   ``ragged_w_consume``): BF16/F16 operands streamed by TMA through the worker's ring, FP32
//   accumulators, the store fused into the epilogue (latch_gemm.cuh's primitives). A task is a box
//   of the output; which expert segments it meets is read from ``offsets`` at run time, by the
//   producer thread and the consumers alike, so both walk the same (expert, sub-tile, K block)
//   sequence and agree on the ring position without talking. Offsets are final before either reads
//   them: the producer reads them after the task's waits (and, for a writer on its own SM, after
//   Task::dep), the consumers after the producer handed the task over.
// - SIMT (``ragged_rows``, ``ragged_grad_w_tile``): everything else (FP32/FP64 operands, shapes TMA
//   cannot stream), rounding operands to ``ROUND`` inside the body.
#pragma once

#include "latch_gemm.cuh"
#include "latch_matmul.cuh"
#include "latch_route.cuh"

namespace latch {

// Rows [r_lo, r_hi) of token_topk: the k largest of each row of probs[., E], descending; ties go to
// the lower expert index (a stable descending sort), NaN counts as the largest (as torch.sort).
template <class T, class TI>
__device__ void token_topk_rows(const T* probs, T* values, TI* indices, long long E, int k, long long r_lo,
                                long long r_hi) {
  for (long long r = r_lo + threadIdx.x; r < r_hi; r += LATCH_THREADS) {
    const T* row = probs + r * E;
    long long prev = -1;
    double prev_v = 0;
    for (int s = 0; s < k; ++s) {
      long long best = -1;
      double bv = 0;
      for (long long e = 0; e < E; ++e) {
        const double v = (double)ld<T>(row, e);
        // candidates come after the previous pick in (value desc, index asc) order
        if (prev >= 0) {
          const bool after = (prev_v != prev_v) ? (v != v ? e > prev : true)
                                                : (v != v ? false : (v < prev_v || (v == prev_v && e > prev)));
          if (!after) continue;
        }
        const bool better = best < 0 || (v != v && bv == bv) || (v == v && bv == bv && v > bv);
        if (better) {
          best = e;
          bv = v;
        }
      }
      st<T>(values, r * k + s, bv);
      indices[r * k + s] = (TI)best;
      prev = best;
      prev_v = bv;
    }
  }
}

// ---- fast routing bodies ----------------------------------------------------------------------

// Rows [r_lo, r_hi) of token_topk, one warp per row: lane l holds experts l, l + 32, ...; each of
// the k rounds takes, per lane, its best expert strictly after the previous pick in the order
// (value descending, NaN first, index ascending), then the warp's best by five shuffles. Same
// result as token_topk_rows (a stable descending sort's first k).
template <class V>
__device__ __forceinline__ bool topk_before(V v, long long e, V bv, long long be) {  // (v, e) precedes (bv, be)
  if (be < 0) return e >= 0;
  if (e < 0) return false;
  const bool vn = v != v, bn = bv != bv;
  if (vn != bn) return vn;
  if (!vn && v != bv) return v > bv;
  return e < be;
}

template <class T, class TI>
__device__ void token_topk_warps(const T* probs, T* values, TI* indices, long long E, int k, long long r_lo,
                                 long long r_hi) {
  typedef decltype(ld<T>(probs, 0)) V;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (long long r = r_lo + warp; r < r_hi; r += LATCH_THREADS / 32) {
    const T* row = probs + r * E;
    long long prev = -1;
    V prev_v = V(0);
    for (int s = 0; s < k; ++s) {
      long long best = -1;
      V bv = V(0);
      for (long long e = lane; e < E; e += 32) {
        const V v = ld<T>(row, e);
        if (prev >= 0 && !topk_before(prev_v, prev, v, e)) continue;  // not after the previous pick
        if (topk_before(v, e, bv, best)) {
          best = e;
          bv = v;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const long long ob = __shfl_xor_sync(0xffffffffu, best, o);
        const V ov = __shfl_xor_sync(0xffffffffu, bv, o);
        if (topk_before(ov, ob, bv, best)) {
          best = ob;
          bv = ov;
        }
      }
      if (lane == 0) {
        st<T>(values, r * k + s, bv);
        indices[r * k + s] = (TI)best;
      }
      prev = best;
      prev_v = bv;
    }
  }
}

// out rows [r_lo, r_hi) x columns [c_lo, c_hi) of a ragged product: each expert's segment of the
// rows multiplies that expert's matrix; rows in no segment are zero. MODE 0: out = x @ w[e]
// (w [E, K, N]); MODE 1: out = x @ w[e]^T (w [E, N, K]).
template <class TX, class TW, class TO, class Acc, int ROUND, int MODE, class TOff>
__device__ void ragged_rows(const TX* x, const TW* w, const TOff* offsets, TO* out, long long E, long long K,
                            long long N, long long r_lo, long long r_hi, long long c_lo, long long c_hi, char* smem) {
  const long long first = (long long)offsets[0], last = (long long)offsets[E];
  for (long long r = r_lo; r < r_hi; ++r) {  // zero rows outside every segment
    if (r >= first && r < last) continue;
    for (long long c = c_lo + threadIdx.x; c < c_hi; c += LATCH_THREADS) st<TO>(out, r * N + c, 0.0f);
  }
  for (long long e = 0; e < E; ++e) {
    const long long lo = max((long long)offsets[e], r_lo), hi = min((long long)offsets[e + 1], r_hi);
    if (lo >= hi) continue;
    // matmul_tile's row range is absolute within its A (here x with M = r_hi rows addressable)
    matmul_tile<TX, TW, TO, Acc, ROUND, false, MODE == 1>(x, w + e * K * N, out, hi, N, K, 0, 1, lo, hi, c_lo, c_hi,
                                                         smem);
    latch::block_sync();
  }
}

// dw[e] rows [i_lo, i_hi) x columns [j_lo, j_hi), for experts [e_lo, e_hi): x[seg]^T @ g[seg].
template <class TX, class TG, class TO, class Acc, int ROUND, class TOff>
__device__ void ragged_grad_w_tile(const TX* x, const TG* g, const TOff* offsets, TO* dw, long long Din, long long Dout,
                                   long long e_lo, long long e_hi, long long i_lo, long long i_hi, long long j_lo,
                                   long long j_hi, char* smem) {
  for (long long e = e_lo; e < e_hi; ++e) {
    const long long lo = (long long)offsets[e], hi = (long long)offsets[e + 1];
    TO* dwe = dw + e * Din * Dout;
    if (lo >= hi) {
      for (long long i = i_lo; i < i_hi; ++i)
        for (long long j = j_lo + threadIdx.x; j < j_hi; j += LATCH_THREADS) st<TO>(dwe, i * Dout + j, 0.0f);
      continue;
    }
    // A = x[lo:hi]^T ([Din, hi-lo], stored as x rows), B = g[lo:hi] ([hi-lo, Dout])
    matmul_tile<TX, TG, TO, Acc, ROUND, true, false>(x + lo * Din, g + lo * Dout, dwe, Din, Dout, hi - lo, 0, 1, i_lo,
                                                     i_hi, j_lo, j_hi, smem);
    latch::block_sync();
  }
}

// ---- grouped wgmma over expert segments --------------------------------------------------------

namespace moe {

// One 3-D box of ``map`` at element coordinates (c0 innermost, c1, c2); see sm90::tma_load_2d.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
      ::"r"(sm90::smem_addr(dst)), "l"(map), "r"(sm90::smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// Zero the K rows [valid, 64) of this warpgroup's A block and of every B block of a stage (both
// MN-major: a K row is one 128-byte row, whatever the swizzle), then make the zeros visible to the
// tensor cores (async proxy) before any warp of the warpgroup issues its wgmma. Both warpgroups zero
// B; they write the same zeros, and the stage is released only after both are done with it.
template <int BN>
__device__ __forceinline__ void mask_k_rows(char* st, int wg, int valid) {
  const int t = threadIdx.x & 127;
  const int chunks = (64 - valid) * 8;  // 16-byte chunks past the valid rows of one 8 KiB block
  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
  for (int i = t; i < chunks * (1 + BN / 64); i += 128) {
    const int b = i / chunks, q = i - b * chunks;
    char* base = b == 0 ? st + 8192 * wg : st + GemmShape<128, BN, true, false>::A_BYTES + 8192 * (b - 1);
    *reinterpret_cast<uint4*>(base + valid * 128 + q * 16) = z;
  }
  sm90::fence_proxy_async_shared();
  sm90::named_sync(2 + wg, 128);
}

// Rows [lo, hi) of expert e's segment inside [r_lo, r_hi) (empty: lo >= hi).
template <class TOff>
__device__ __forceinline__ void segment(const TOff* offsets, int e, int r_lo, int r_hi, int& lo, int& hi) {
  lo = max((int)offsets[e], r_lo);
  hi = min((int)offsets[e + 1], r_hi);
}

}  // namespace moe

// ragged_mm (B_K = false) and ragged_mm_grad_x (B_K = true): out rows [r_lo, r_hi) x columns
// [n_lo, n_hi). Each expert segment inside the rows is computed in 128-row sub-tiles starting at the
// segment's first row (TMA boxes start at any row; rows past the segment are loaded, multiplied and
// not stored). A: the rows, [R, K] K-major, map (K, R) with boxes (64, 128).
// B_K = false: w [E, K, N] (w[e] N-major), 3-D map (N, K, E), boxes (64, 64, 1): K blocks never
//   reach the next expert (they read zeros past K).
// B_K = true: w [E, N, K] (out = x @ w[e]^T: w[e] K-major), 3-D map (K, N, E), boxes (64, BN, 1).
template <int BN, bool B_K, class TOff>
__device__ __forceinline__ bool ragged_produce(Pipe& p, const void* map_a, const void* map_b, const TOff* offsets,
                                               int E, int K, int r_lo, int r_hi, int n_lo, int n_hi) {
  typedef GemmShape<128, BN, false, B_K> S;
  for (int e = 0; e < E; ++e) {
    int lo, hi;
    moe::segment(offsets, e, r_lo, r_hi, lo, hi);
    for (int m0 = lo; m0 < hi; m0 += 128) {
      for (int n0 = n_lo; n0 < n_hi; n0 += BN) {
        for (int k = 0; k < K; k += GEMM_BK) {
          if (!pipe_wait(&p.empty[p.stage], p.phase ^ 1u, p)) return false;
          char* st = p.at(p.stage);
          uint64_t* full = &p.full[p.stage];
          sm90::mbar_arrive_expect_tx(full, S::STAGE);
          sm90::tma_load_2d(st, map_a, full, k, m0);
          char* sb = st + S::A_BYTES;
          if (B_K) {
            moe::tma_load_3d(sb, map_b, full, k, n0, e);
          } else {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j) moe::tma_load_3d(sb + 8192 * j, map_b, full, n0 + 64 * j, k, e);
          }
          p.advance();
        }
      }
    }
  }
  return true;
}

template <class T, int BN, bool B_K, class TO, class TOff>
__device__ __forceinline__ bool ragged_consume(Pipe& p, TO* out, const TOff* offsets, int E, int K, int N, int r_lo,
                                               int r_hi, int n_lo, int n_hi) {
  // rows outside every segment are zero (offsets need not cover all rows): [r_lo, first) and
  // [last, r_hi), usually both empty (route_order's offsets cover every row). Run 29's loop over
  // every element of the box (a 32-bit division per element, 64 per thread at 128 x 128) ran
  // before the first wgmma of every task even when it stored nothing.
  const int first = max(r_lo, min(r_hi, (int)offsets[0])), last = min(r_hi, max(r_lo, (int)offsets[E]));
  for (int r = r_lo; r < first; ++r)
    for (int c = n_lo + (int)threadIdx.x; c < n_hi; c += LATCH_THREADS) st<TO>(out, (long long)r * N + c, 0.0f);
  for (int r = last; r < r_hi; ++r)
    for (int c = n_lo + (int)threadIdx.x; c < n_hi; c += LATCH_THREADS) st<TO>(out, (long long)r * N + c, 0.0f);
  for (int e = 0; e < E; ++e) {
    int lo, hi;
    moe::segment(offsets, e, r_lo, r_hi, lo, hi);
    if (lo >= hi) continue;
    const GemmStore<TO> epi{out, (long long)N, hi, n_hi, (N & 1) == 0};
    if (!gemm_consume<T, 128, BN, false, B_K>(p, epi, lo, hi, n_lo, n_hi, 0, K)) return false;
  }
  return true;
}

// ragged_mm_grad_w: dw[e][i, j] = sum over expert e's rows r of x[r, i] * g[r, j], for experts
// [e_lo, e_hi), rows i in [i_lo, i_hi) of Din, columns j in [j_lo, j_hi) of Dout: grouped along K
// (the rows). A = x^T: x [R, Din] is M-major, map (Din, R), boxes (64, 64); B = g [R, Dout],
// N-major, map (Dout, R), boxes (64, 64). K blocks start at the segment's first row; the last one
// reads rows of the next expert, which the consumers zero in shared memory (mask_k_rows) before
// the product. Each element is one fixed-order sum: deterministic.
template <int BN, class TOff>
__device__ __forceinline__ bool ragged_w_produce(Pipe& p, const void* map_x, const void* map_g, const TOff* offsets,
                                                 int e_lo, int e_hi, int i_lo, int i_hi, int j_lo, int j_hi) {
  typedef GemmShape<128, BN, true, false> S;
  for (int e = e_lo; e < e_hi; ++e) {
    const int lo = (int)offsets[e], hi = (int)offsets[e + 1];
    for (int m0 = i_lo; m0 < i_hi; m0 += 128) {
      for (int n0 = j_lo; n0 < j_hi; n0 += BN) {
        for (int k = lo; k < hi; k += GEMM_BK) {
          if (!pipe_wait(&p.empty[p.stage], p.phase ^ 1u, p)) return false;
          char* st = p.at(p.stage);
          uint64_t* full = &p.full[p.stage];
          sm90::mbar_arrive_expect_tx(full, S::STAGE);
          sm90::tma_load_2d(st, map_x, full, m0, k);
          sm90::tma_load_2d(st + 8192, map_x, full, m0 + 64, k);
          char* sb = st + S::A_BYTES;
#pragma unroll
          for (int j = 0; j < BN / 64; ++j) sm90::tma_load_2d(sb + 8192 * j, map_g, full, n0 + 64 * j, k);
          p.advance();
        }
      }
    }
  }
  return true;
}

namespace moe {

// One K block of grad_w on the consumer side (gemm_k_block with the tail rows masked).
template <class T, int BN, bool FIRST>
__device__ __forceinline__ bool w_k_block(Pipe& p, float (&acc)[BN / 2], int wg, int valid) {
  if (!pipe_wait_warp(&p.full[p.stage], p.phase, p)) {
    sm90::wgmma_wait<0>();
    return false;
  }
  char* st = p.at(p.stage);
  if (valid < GEMM_BK) mask_k_rows<BN>(st, wg, valid);
  const char* sa = st + 8192 * wg;
  const char* sb = st + GemmShape<128, BN, true, false>::A_BYTES;
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < GEMM_BK / 16; ++kk) {
    const uint64_t da = sm90::wgmma_desc(sa + 2048 * kk, 8192, 1024);
    const uint64_t db = sm90::wgmma_desc(sb + 2048 * kk, 8192, 1024);
    Wgmma<BN, 1, 1, T>::run(acc, da, db, (FIRST && kk == 0) ? 0 : 1);
  }
  sm90::wgmma_commit();
  return true;
}

}  // namespace moe

template <class T, int BN, class TO, class TOff>
__device__ __forceinline__ bool ragged_w_consume(Pipe& p, TO* dw, const TOff* offsets, int Din, int Dout, int e_lo,
                                                 int e_hi, int i_lo, int i_hi, int j_lo, int j_hi) {
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  for (int e = e_lo; e < e_hi; ++e) {
    const int lo = (int)offsets[e], hi = (int)offsets[e + 1];
    const int nk = hi > lo ? (hi - lo + GEMM_BK - 1) / GEMM_BK : 0;
    const GemmStore<TO> epi{dw + (long long)e * Din * Dout, (long long)Dout, i_hi, j_hi, (Dout & 1) == 0};
    for (int m0 = i_lo; m0 < i_hi; m0 += 128) {
      for (int n0 = j_lo; n0 < j_hi; n0 += BN) {
        float acc[BN / 2];
        if (nk > 0) {
          if (!moe::w_k_block<T, BN, true>(p, acc, wg, min(GEMM_BK, hi - lo))) return false;
          uint32_t prev = p.stage;
          p.advance();
#pragma unroll 1
          for (int kb = 1; kb < nk; ++kb) {
            if (!moe::w_k_block<T, BN, false>(p, acc, wg, min(GEMM_BK, hi - lo - GEMM_BK * kb))) return false;
            sm90::wgmma_wait<1>();
            if (lane == 0) sm90::mbar_arrive(&p.empty[prev]);
            prev = p.stage;
            p.advance();
          }
          sm90::wgmma_wait<0>();
          if (lane == 0) sm90::mbar_arrive(&p.empty[prev]);
        } else {
#pragma unroll
          for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;  // an expert without rows: dw[e] = 0
        }
        const int row = m0 + 64 * wg + 16 * warp + (lane >> 2);
        const int col = n0 + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          epi(row, col + 8 * j, acc[4 * j], acc[4 * j + 1]);
          epi(row + 8, col + 8 * j, acc[4 * j + 2], acc[4 * j + 3]);
        }
      }
    }
  }
  return true;
}

}  // namespace latch

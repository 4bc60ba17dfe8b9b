// MoE bodies (latch_ops/moe/specs.py): token_topk and its backward, route_order, and the ragged
// matrix products (forward, grad_x, grad_w) over expert segments given by ``offsets`` (data).
#pragma once

#include "latch_matmul.cuh"

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

// The whole route_order in one block: counts, offsets, then a stable rank of every (token, slot)
// pair among the pairs of its expert, 256 pairs at a time. smem: E + 256 ints.
template <class TI, class TO>
__device__ void route_order_all(const TI* indices, TO* token, TO* position, TO* offsets, long long N, int k,
                                long long E, int* smem) {
  int* run = smem;            // [E]: counts, then the next free row of each expert
  int* chunk = smem + E;      // [LATCH_THREADS]: the experts of the current chunk of pairs
  const long long P = N * (long long)k;
  for (long long e = threadIdx.x; e < E; e += LATCH_THREADS) run[e] = 0;
  latch::block_sync();
  for (long long p = threadIdx.x; p < P; p += LATCH_THREADS) {
    const long long e = (long long)indices[p];
    if (e < 0 || e >= E) {
      latch_report(ERR_INDEX_RANGE, e, E);
      continue;
    }
    atomicAdd(&run[e], 1);
  }
  latch::block_sync();
  if (threadIdx.x == 0) {
    int acc = 0;
    for (long long e = 0; e < E; ++e) {
      const int c = run[e];
      offsets[e] = (TO)acc;
      run[e] = acc;
      acc += c;
    }
    offsets[E] = (TO)acc;
  }
  latch::block_sync();
  for (long long base = 0; base < P; base += LATCH_THREADS) {
    const long long p = base + threadIdx.x;
    long long e = p < P ? (long long)indices[p] : -1;
    if (e < 0 || e >= E) e = -1;
    chunk[threadIdx.x] = (int)e;
    latch::block_sync();
    if (e >= 0) {
      int rank = 0;
      for (int q = 0; q < (int)threadIdx.x; ++q) rank += chunk[q] == (int)e;
      const long long row = run[e] + rank;
      token[row] = (TO)(p / k);
      position[p] = (TO)row;
    }
    latch::block_sync();
    if (e >= 0) atomicAdd(&run[e], 1);
    latch::block_sync();
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

}  // namespace latch

// Row-wise neural-network bodies: softmax / log_softmax over the last dim and their backward,
// layer_norm over trailing dims, and the two halves of cross-entropy (nll_loss and its backward).
//
// Rows are whole: a task covers a range of rows (the tile's leading coordinates, flattened by the
// generated code), and every row is reduced in full by one warp. Statistics are kept in float (f32
// and 16-bit inputs) or double (f64 inputs); exp/log use the precise library functions.
#pragma once

#include "latch_elementwise.cuh"

namespace latch {

// Online (max, sum of exp) over one row, one warp; returns the pair reduced over the warp.
template <class T, class Acc>
__device__ __forceinline__ void row_max_sumexp(const T* x, long long C, Acc& m_out, Acc& s_out) {
  const int lane = threadIdx.x & 31;
  Acc m = lowest<Acc>(), s = Acc(0);
  for (long long j = lane; j < C; j += 32) {
    const Acc v = (Acc)ld<T>(x, j);
    if (v != v) {  // NaN poisons the row, as in torch
      m = v;
    } else if (v > m) {
      s = s * ew::exp_(m - v) + Acc(1);
      m = v;
    } else if (v != lowest<Acc>()) {  // -inf contributes nothing (and -inf - -inf would be NaN)
      s += ew::exp_(v - m);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const Acc m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    if (m != m || m2 != m2) {
      m = m != m ? m : m2;
    } else {
      const Acc mm = m > m2 ? m : m2;
      s = (m == lowest<Acc>() ? Acc(0) : s * ew::exp_(m - mm)) + (m2 == lowest<Acc>() ? Acc(0) : s2 * ew::exp_(m2 - mm));
      m = mm;
    }
  }
  m_out = m;
  s_out = s;
}

// One warp: y = softmax(x) or log_softmax(x) for one row of length C, columns [c_lo, c_hi) written.
template <bool LOG, class T, class TO, class Acc>
__device__ __forceinline__ void softmax_row(const T* x, TO* y, long long C, long long c_lo, long long c_hi) {
  const int lane = threadIdx.x & 31;
  Acc m, s;
  row_max_sumexp<T, Acc>(x, C, m, s);
  const Acc lse = m + ew::log_(s);
  for (long long j = c_lo + lane; j < c_hi; j += 32) {
    const Acc v = (Acc)ld<T>(x, j);
    st<TO>(y, j, LOG ? v - lse : ew::exp_(v - m) / s);
  }
}

// One warp, one row: dx = y * (g - sum(g * y)) (softmax) or dx = g - exp(y) * sum(g) (log_softmax).
template <bool LOG, class T, class Acc>
__device__ __forceinline__ void softmax_backward_row(const T* g, const T* y, T* dx, long long C, long long c_lo,
                                                     long long c_hi) {
  const int lane = threadIdx.x & 31;
  Acc s = Acc(0);
  for (long long j = lane; j < C; j += 32) {
    const Acc gv = (Acc)ld<T>(g, j);
    s += LOG ? gv : gv * (Acc)ld<T>(y, j);
  }
  s = warp_reduce<SumOp>(s);
  for (long long j = c_lo + lane; j < c_hi; j += 32) {
    const Acc gv = (Acc)ld<T>(g, j), yv = (Acc)ld<T>(y, j);
    st<T>(dx, j, LOG ? gv - ew::exp_(yv) * s : yv * (gv - s));
  }
}

// One warp, one row of length D: y = (x - mean) * rstd * w + b (w, b, y, mean, rstd may be null).
template <class T, class Acc>
__device__ __forceinline__ void layer_norm_row(const T* x, const T* w, const T* b, T* y, T* mean_out, T* rstd_out,
                                               long long D, Acc eps) {
  const int lane = threadIdx.x & 31;
  Acc s = Acc(0);
  for (long long j = lane; j < D; j += 32) s += (Acc)ld<T>(x, j);
  const Acc mean = warp_reduce<SumOp>(s) / Acc(D);
  Acc q = Acc(0);
  for (long long j = lane; j < D; j += 32) {
    const Acc d = (Acc)ld<T>(x, j) - mean;
    q += d * d;
  }
  const Acc var = warp_reduce<SumOp>(q) / Acc(D);
  const Acc rstd = Acc(1) / ew::sqrt_(var + eps);
  if (y) {
    for (long long j = lane; j < D; j += 32) {
      Acc v = ((Acc)ld<T>(x, j) - mean) * rstd;
      if (w) v = v * (Acc)ld<T>(w, j);
      if (b) v = v + (Acc)ld<T>(b, j);
      st<T>(y, j, v);
    }
  }
  if (lane == 0) {
    if (mean_out) st<T>(mean_out, 0, mean);
    if (rstd_out) st<T>(rstd_out, 0, rstd);
  }
}

// layer_norm backward, the whole tensor in one block: dx per row (warp per row), then dw/db per
// column (thread per column, rows in order: deterministic).
template <class T, class Acc>
__device__ void layer_norm_backward_all(const T* g, const T* x, const T* mean, const T* rstd, const T* w, T* dx, T* dw,
                                        T* db, long long R, long long D) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = LATCH_THREADS >> 5;
  if (dx) {
    for (long long r = warp; r < R; r += nw) {
      const Acc mu = (Acc)ld<T>(mean, r), rs = (Acc)ld<T>(rstd, r);
      Acc s1 = Acc(0), s2 = Acc(0);
      for (long long j = lane; j < D; j += 32) {
        const Acc gw = (Acc)ld<T>(g, r * D + j) * (w ? (Acc)ld<T>(w, j) : Acc(1));
        const Acc xh = ((Acc)ld<T>(x, r * D + j) - mu) * rs;
        s1 += gw;
        s2 += gw * xh;
      }
      s1 = warp_reduce<SumOp>(s1) / Acc(D);
      s2 = warp_reduce<SumOp>(s2) / Acc(D);
      for (long long j = lane; j < D; j += 32) {
        const Acc gw = (Acc)ld<T>(g, r * D + j) * (w ? (Acc)ld<T>(w, j) : Acc(1));
        const Acc xh = ((Acc)ld<T>(x, r * D + j) - mu) * rs;
        st<T>(dx, r * D + j, rs * (gw - s1 - xh * s2));
      }
    }
  }
  if (dw || db) {
    for (long long j = threadIdx.x; j < D; j += LATCH_THREADS) {
      double sw = 0, sb = 0;
      for (long long r = 0; r < R; ++r) {
        const double gv = (double)ld<T>(g, r * D + j);
        sb += gv;
        sw += gv * (((double)ld<T>(x, r * D + j) - (double)ld<T>(mean, r)) * (double)ld<T>(rstd, r));
      }
      if (dw) st<T>(dw, j, sw);
      if (db) st<T>(db, j, sb);
    }
  }
}

// nll_loss over rows (whole tensor, one block). reduction: 0 none, 1 mean, 2 sum.
template <class T, class TI>
__device__ void nll_loss_all(const T* logp, const TI* target, const T* weight, T* loss, T* total_weight, long long N,
                             long long C, long long ignore_index, int reduction, double* scratch) {
  double acc = 0, tw = 0;
  for (long long i = threadIdx.x; i < N; i += LATCH_THREADS) {
    const long long t = (long long)target[i];
    if (t == ignore_index) {
      if (reduction == 0 && loss) st<T>(loss, i, 0.0f);
      continue;
    }
    if (t < 0 || t >= C) {
      latch_report(ERR_INDEX_RANGE, t, C);
      continue;
    }
    const double w = weight ? (double)ld<T>(weight, t) : 1.0;
    const double term = -w * (double)ld<T>(logp, i * C + t);
    if (reduction == 0 && loss) st<T>(loss, i, term);
    acc += term;
    tw += w;
  }
  acc = block_reduce<SumOp>(acc, scratch);
  tw = block_reduce<SumOp>(tw, scratch);
  if (threadIdx.x == 0) {
    if (reduction == 1 && loss) st<T>(loss, 0, acc / tw);
    if (reduction == 2 && loss) st<T>(loss, 0, acc);
    if (total_weight) st<T>(total_weight, 0, reduction == 0 ? 0.0 : tw);
  }
}

}  // namespace latch

// Attention bodies: latch::sdpa (forward, out and lse) and latch::sdpa_backward (dq, dk, dv),
// matching latch_ops/attention.py (causal = top-left aligned: key j > query i is masked).
//
// Simple and correct first: one warp per query row (forward, dq) or per key row (dk, dv). Scores
// are computed 32 at a time (one per lane) and staged in the warp's 64 values of shared memory;
// the output row accumulates in registers, NC chunks of 32 columns per lane (head dims <= 32*NC).
// ROUND = 1 rounds q, k, v (and P before P V) to bf16, modelling BF16 attention with f32 softmax.
#pragma once

#include "latch_elementwise.cuh"
#include "latch_matmul.cuh"

namespace latch {

template <class T, class Acc, int ROUND>
__device__ __forceinline__ Acc dot_row(const T* a, const T* b, int n) {
  Acc s = Acc(0);
  for (int d = 0; d < n; ++d) s += round_operand<ROUND>((Acc)ld<T>(a, d)) * round_operand<ROUND>((Acc)ld<T>(b, d));
  return s;
}

// One warp: out row i (Dv values) and its lse, for one (b, h) whose q/k/v/out/lse start at the
// given pointers ([Tq, D], [Tk, D], [Tk, Dv], [Tq, Dv], [Tq]).
template <class T, class TL, class Acc, int NC, bool CAUSAL, int ROUND>
__device__ void sdpa_forward_row(const T* q, const T* k, const T* v, T* out, TL* lse, long long i, long long Tk,
                                 int D, int Dv, Acc scale, Acc* wsm) {
  const int lane = threadIdx.x & 31;
  const T* qi = q + i * D;
  const long long jend = CAUSAL ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
  Acc m = lowest<Acc>(), s = Acc(0);
  for (long long j = lane; j < jend; j += 32) {
    const Acc sc = scale * dot_row<T, Acc, ROUND>(qi, k + j * D, D);
    if (sc > m) {
      s = s * ew::exp_(m - sc) + Acc(1);
      m = sc;
    } else {
      s += ew::exp_(sc - m);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const Acc m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    const Acc mm = m > m2 ? m : m2;
    s = (s == Acc(0) ? Acc(0) : s * ew::exp_(m - mm)) + (s2 == Acc(0) ? Acc(0) : s2 * ew::exp_(m2 - mm));
    m = mm;
  }
  const Acc L = m + ew::log_(s);
  if (lane == 0 && lse) st<TL>(lse, i, L);
  Acc acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = Acc(0);
  for (long long jb = 0; jb < jend; jb += 32) {
    const long long j = jb + lane;
    Acc p = Acc(0);
    if (j < jend) p = round_operand<ROUND>(ew::exp_(scale * dot_row<T, Acc, ROUND>(qi, k + j * D, D) - L));
    wsm[lane] = p;
    __syncwarp();
    const int nj = (int)(jend - jb < 32 ? jend - jb : 32);
    for (int jj = 0; jj < nj; ++jj) {
      const Acc pj = wsm[jj];
      const T* vr = v + (jb + jj) * Dv;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const int e = c * 32 + lane;
        if (e < Dv) acc[c] += pj * round_operand<ROUND>((Acc)ld<T>(vr, e));
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int e = c * 32 + lane;
    if (e < Dv) st<T>(out, i * Dv + e, acc[c]);
  }
}

// dS_ij = P_ij (dP_ij - delta_i + glse_i), P_ij = exp(s_ij - lse_i), dP_ij = dO_i . v_j,
// delta_i = dO_i . O_i.
template <class T, class TL, class Acc, int ROUND>
__device__ __forceinline__ void sdpa_p_ds(const T* q, const T* k, const T* v, const T* go, const T* o, const TL* lse,
                                          const TL* glse, long long i, long long j, int D, int Dv, Acc scale, Acc& p,
                                          Acc& ds) {
  const Acc sc = scale * dot_row<T, Acc, ROUND>(q + i * D, k + j * D, D);
  p = ew::exp_(sc - (Acc)ld<TL>(lse, i));
  Acc dp = Acc(0), delta = Acc(0);
  for (int e = 0; e < Dv; ++e) {
    const Acc g = (Acc)ld<T>(go, i * Dv + e);
    dp += g * round_operand<ROUND>((Acc)ld<T>(v, j * Dv + e));
    delta += g * (Acc)ld<T>(o, i * Dv + e);
  }
  ds = p * (dp - delta + (glse ? (Acc)ld<TL>(glse, i) : Acc(0)));
}

// The whole backward of one (b, h), by the whole block: dq by query rows, dk and dv by key rows.
template <class T, class TL, class Acc, int NC, bool CAUSAL, int ROUND>
__device__ void sdpa_backward_bh(const T* go, const TL* glse, const T* q, const T* k, const T* v, const T* o,
                                 const TL* lse, T* dq, T* dk, T* dv, long long Tq, long long Tk, int D, int Dv,
                                 Acc scale, Acc* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = LATCH_THREADS >> 5;
  Acc* w_p = smem + warp * 64;
  Acc* w_ds = w_p + 32;
  for (long long i = warp; i < Tq; i += nw) {  // dq_i = scale sum_j dS_ij k_j
    const long long jend = CAUSAL ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
    Acc acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = Acc(0);
    for (long long jb = 0; jb < jend; jb += 32) {
      const long long j = jb + lane;
      Acc p = Acc(0), ds = Acc(0);
      if (j < jend) sdpa_p_ds<T, TL, Acc, ROUND>(q, k, v, go, o, lse, glse, i, j, D, Dv, scale, p, ds);
      w_ds[lane] = ds;
      __syncwarp();
      const int nj = (int)(jend - jb < 32 ? jend - jb : 32);
      for (int jj = 0; jj < nj; ++jj) {
        const Acc d_s = w_ds[jj];
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int d = c * 32 + lane;
          if (d < D) acc[c] += d_s * round_operand<ROUND>((Acc)ld<T>(k, (jb + jj) * D + d));
        }
      }
      __syncwarp();
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = c * 32 + lane;
      if (d < D) st<T>(dq, i * D + d, scale * acc[c]);
    }
  }
  for (long long j = warp; j < Tk; j += nw) {  // dv_j = sum_i P_ij dO_i; dk_j = scale sum_i dS_ij q_i
    const long long istart = CAUSAL ? j : 0;
    Acc av[NC], ak[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) av[c] = ak[c] = Acc(0);
    for (long long ib = istart; ib < Tq; ib += 32) {
      const long long i = ib + lane;
      Acc p = Acc(0), ds = Acc(0);
      if (i < Tq) sdpa_p_ds<T, TL, Acc, ROUND>(q, k, v, go, o, lse, glse, i, j, D, Dv, scale, p, ds);
      w_p[lane] = round_operand<ROUND>(p);
      w_ds[lane] = ds;
      __syncwarp();
      const int ni = (int)(Tq - ib < 32 ? Tq - ib : 32);
      for (int ii = 0; ii < ni; ++ii) {
        const Acc pi = w_p[ii], dsi = w_ds[ii];
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int e = c * 32 + lane;
          if (e < Dv) av[c] += pi * (Acc)ld<T>(go, (ib + ii) * Dv + e);
          if (e < D) ak[c] += dsi * round_operand<ROUND>((Acc)ld<T>(q, (ib + ii) * D + e));
        }
      }
      __syncwarp();
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int e = c * 32 + lane;
      if (e < Dv) st<T>(dv, j * Dv + e, av[c]);
      if (e < D) st<T>(dk, j * D + e, scale * ak[c]);
    }
  }
}

}  // namespace latch

// Attention bodies: latch::sdpa (forward, out and lse) and latch::sdpa_backward (dq, dk, dv),
// matching latch_ops/attention.py (causal = top-left aligned: key j > query i is masked).
//
// SIMT bodies (no tensor cores yet): one warp per query row (forward, dq) or per key row (dk, dv). Scores
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

// delta_i = dO_i . O_i, by one lane (the dk/dv rows need it for the lane's own query row).
template <class T, class Acc>
__device__ __forceinline__ Acc sdpa_delta(const T* go, const T* o, long long i, int Dv) {
  Acc delta = Acc(0);
  for (int e = 0; e < Dv; ++e) delta += (Acc)ld<T>(go, i * Dv + e) * (Acc)ld<T>(o, i * Dv + e);
  return delta;
}

// dS_ij = P_ij (dP_ij - delta_i + glse_i), P_ij = exp(s_ij - lse_i), dP_ij = dO_i . v_j.
template <class T, class TL, class Acc, int ROUND>
__device__ __forceinline__ void sdpa_p_ds(const T* q, const T* k, const T* v, const T* go, const TL* lse,
                                          const TL* glse, long long i, long long j, int D, int Dv, Acc scale,
                                          Acc delta, Acc& p, Acc& ds) {
  const Acc sc = scale * dot_row<T, Acc, ROUND>(q + i * D, k + j * D, D);
  p = ew::exp_(sc - (Acc)ld<TL>(lse, i));
  Acc dp = Acc(0);
  for (int e = 0; e < Dv; ++e) dp += (Acc)ld<T>(go, i * Dv + e) * round_operand<ROUND>((Acc)ld<T>(v, j * Dv + e));
  ds = p * (dp - delta + (glse ? (Acc)ld<TL>(glse, i) : Acc(0)));
}

// dq rows [r0, r1) of one (b, h) (pointers at that head), one warp per row:
// dq_i = scale sum_j dS_ij k_j over the keys row i sees.
template <class T, class TL, class Acc, int NC, bool CAUSAL, int ROUND>
__device__ void sdpa_dq_rows(const T* go, const TL* glse, const T* q, const T* k, const T* v, const T* o,
                             const TL* lse, T* dq, long long r0, long long r1, long long Tk, int D, int Dv,
                             Acc scale, Acc* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = LATCH_THREADS >> 5;
  Acc* w_ds = smem + warp * 64 + 32;
  for (long long i = r0 + warp; i < r1; i += nw) {
    const long long jend = CAUSAL ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
    Acc delta = Acc(0);
    for (int e = lane; e < Dv; e += 32) delta += (Acc)ld<T>(go, i * Dv + e) * (Acc)ld<T>(o, i * Dv + e);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) delta += __shfl_xor_sync(0xffffffffu, delta, off);
    Acc acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = Acc(0);
    for (long long jb = 0; jb < jend; jb += 32) {
      const long long j = jb + lane;
      Acc p = Acc(0), ds = Acc(0);
      if (j < jend) sdpa_p_ds<T, TL, Acc, ROUND>(q, k, v, go, lse, glse, i, j, D, Dv, scale, delta, p, ds);
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
}

// dk, dv rows [k0, k1) of one key/value head, summed over the G query heads of its group in head
// order (the same order on every run: no atomics), one warp per key row:
// dv_j = sum_h sum_i P_ij dO_i; dk_j = scale sum_h sum_i dS_ij q_i. Query-head pointers (go, glse,
// q, o, lse) are at the group's first head; head h of the group is ``h * q_head`` elements on
// (``h * Tq`` for the per-row statistics).
template <class T, class TL, class Acc, int NC, bool CAUSAL, int ROUND>
__device__ void sdpa_dkdv_rows(const T* go, const TL* glse, const T* q, const T* k, const T* v, const T* o,
                               const TL* lse, T* dk, T* dv, long long k0, long long k1, int G, long long Tq,
                               int D, int Dv, Acc scale, Acc* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = LATCH_THREADS >> 5;
  Acc* w_p = smem + warp * 64;
  Acc* w_ds = w_p + 32;
  for (long long j = k0 + warp; j < k1; j += nw) {
    const long long istart = CAUSAL ? j : 0;
    Acc av[NC], ak[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) av[c] = ak[c] = Acc(0);
    for (int h = 0; h < G; ++h) {
      const T* goh = go + h * Tq * Dv;
      const T* qh = q + h * Tq * D;
      const T* oh = o + h * Tq * Dv;
      const TL* lh = lse + h * Tq;
      const TL* gh = glse ? glse + h * Tq : glse;
      for (long long ib = istart; ib < Tq; ib += 32) {
        const long long i = ib + lane;
        Acc p = Acc(0), ds = Acc(0);
        if (i < Tq)
          sdpa_p_ds<T, TL, Acc, ROUND>(qh, k, v, goh, lh, gh, i, j, D, Dv, scale, sdpa_delta<T, Acc>(goh, oh, i, Dv),
                                       p, ds);
        w_p[lane] = round_operand<ROUND>(p);
        w_ds[lane] = ds;
        __syncwarp();
        const int ni = (int)(Tq - ib < 32 ? Tq - ib : 32);
        for (int ii = 0; ii < ni; ++ii) {
          const Acc pi = w_p[ii], dsi = w_ds[ii];
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            const int e = c * 32 + lane;
            if (e < Dv) av[c] += pi * (Acc)ld<T>(goh, (ib + ii) * Dv + e);
            if (e < D) ak[c] += dsi * round_operand<ROUND>((Acc)ld<T>(qh, (ib + ii) * D + e));
          }
        }
        __syncwarp();
      }
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

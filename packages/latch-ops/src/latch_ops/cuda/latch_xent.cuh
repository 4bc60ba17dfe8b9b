// Cross-entropy over stored logits (latch_ops/cross_entropy.py): the LM head's row statistics and
// its logits gradient, each one pass over the logits.
//
//   cross_entropy_row:      one warp, one row: online (max, sum exp) over V, then lse, the target's
//                           nll and the valid flag (lane 0 writes them). Deterministic: each lane
//                           walks its columns in order, the warp combines in a fixed butterfly.
//   cross_entropy_grad_tile: every consumer thread, 8 consecutive elements of the tile at a time:
//                           (exp(x - lse) - onehot) * scale, or 0 on an ignored row.
// BF16 logits with rows a multiple of 8 long and 16-byte aligned take 16-byte vector loads and
// stores; anything else the scalar path. Plain (coherent) loads, never ld.global.nc: the logits are
// written earlier in the same launch, into arena bytes that may have held another value before. Statistics in Acc (float; double for f64 logits).
#pragma once

#include <type_traits>

#include "latch_elementwise.cuh"

namespace latch {

template <class Acc>
__device__ __forceinline__ void xent_online(Acc v, Acc& m, Acc& s) {
  if (v != v) {
    m = v;  // NaN poisons the row, as in torch
  } else if (v > m) {
    s = s * ew::exp_(m - v) + Acc(1);
    m = v;
  } else if (v != lowest<Acc>()) {
    s += ew::exp_(v - m);
  }
}

// Eight values at once: one rescale per chunk (at its max) instead of a branch per element. A NaN
// element makes s NaN (fmaxf skips it, exp does not), so the row's lse is NaN, as in torch.
__device__ __forceinline__ void xent_online8(const float* f, float& m, float& s) {
  float cm = f[0];
#pragma unroll
  for (int k = 1; k < 8; ++k) cm = fmaxf(cm, f[k]);
  if (cm > m) {
    s = m == lowest<float>() ? 0.f : s * ew::exp_(m - cm);
    m = cm;
  }
  if (m == lowest<float>()) return;  // every value so far is -inf: nothing to add
#pragma unroll
  for (int k = 0; k < 8; ++k) s += ew::exp_(f[k] - m);
}

template <class Acc>
__device__ __forceinline__ void xent_combine(Acc& m, Acc& s, Acc m2, Acc s2) {
  if (m != m || m2 != m2) {
    m = m != m ? m : m2;
    return;
  }
  const Acc mm = m > m2 ? m : m2;
  s = (m == lowest<Acc>() ? Acc(0) : s * ew::exp_(m - mm)) + (m2 == lowest<Acc>() ? Acc(0) : s2 * ew::exp_(m2 - mm));
  m = mm;
}

__device__ __forceinline__ bool xent_vec_ok(const void* p, long long n) {
  return ((reinterpret_cast<uintptr_t>(p) & 15) == 0) && (n % 8 == 0);
}

// Unpack 8 bf16 held in a uint4 to floats.
__device__ __forceinline__ void bf16x8_to_float(const uint4& u, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 v = __bfloat1622float2(h[k]);
    f[2 * k] = v.x;
    f[2 * k + 1] = v.y;
  }
}

// 8 16-bit floats held in a uint4, as floats.
template <class T>
__device__ __forceinline__ void to_float8(const uint4& u, float* f) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    bf16x8_to_float(u, f);
  } else {
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 v = __half22float2(h[k]);
      f[2 * k] = v.x;
      f[2 * k + 1] = v.y;
    }
  }
}

template <class T, class Acc>
__device__ __forceinline__ void xent_row_stats(const T* x, long long V, Acc& m, Acc& s) {
  const int lane = threadIdx.x & 31;
  m = lowest<Acc>();
  s = Acc(0);
  bool scalar = true;
  if constexpr (sizeof(T) == 2 && std::is_same<Acc, float>::value) {
    if (xent_vec_ok(x, V)) {
      scalar = false;
      // 4 independent 16-byte loads in flight per lane (8 warps x 2 KiB per SM): enough bytes in
      // flight to stream at HBM rate, where one load per iteration waits out the latency each time.
      const uint4* xv = reinterpret_cast<const uint4*>(x);
      const long long n8 = V / 8;
      long long j = lane;
      for (; j + 96 < n8; j += 128) {
        uint4 u[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) u[q] = xv[j + 32 * q];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          float f[8];
          to_float8<T>(u[q], f);
          xent_online8(f, m, s);
        }
      }
      for (; j < n8; j += 32) {
        float f[8];
        to_float8<T>(xv[j], f);
        xent_online8(f, m, s);
      }
    }
  }
  if (scalar) {
    for (long long j = lane; j < V; j += 32) xent_online<Acc>((Acc)ld<T>(x, j), m, s);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const Acc m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    xent_combine<Acc>(m, s, m2, s2);
  }
}

// One warp: row ``row`` of logits x [*, V]; writes nll[row], lse[row], valid[row].
template <class T, class TI, class TO, class Acc>
__device__ __forceinline__ void cross_entropy_row(const T* x, const TI* target, TO* nll, TO* lse, TO* valid,
                                                  long long row, long long V, long long ignore_index) {
  Acc m, s;
  xent_row_stats<T, Acc>(x + row * V, V, m, s);
  if ((threadIdx.x & 31) != 0) return;
  const Acc l = m + ew::log_(s);
  const long long t = (long long)target[row];
  const bool ok = t != ignore_index;
  if (ok && (t < 0 || t >= V)) {
    latch_report(ERR_INDEX_RANGE, t, V);
    return;
  }
  if (lse) st<TO>(lse, row, l);  // an output nothing reads has no memory (nullptr)
  if (nll) st<TO>(nll, row, ok ? l - (Acc)ld<T>(x, row * V + t) : Acc(0));
  if (valid) st<TO>(valid, row, ok ? Acc(1) : Acc(0));
}

// The tile [r0, r1) x [c0, c1) of dlogits; every consumer thread takes runs of 8 columns.
template <class T, class TI, class TS, class TO, class Acc>
__device__ __forceinline__ void cross_entropy_grad_tile(const TS* grad, const T* x, const TI* target, const TS* lse,
                                                        const TS* total, TO* dx, long long V, long long r0,
                                                        long long r1, long long c0, long long c1,
                                                        long long ignore_index, bool mean) {
  const Acc scale = mean ? (Acc)ld<TS>(grad, 0) / (Acc)ld<TS>(total, 0) : (Acc)ld<TS>(grad, 0);
  const long long width = c1 - c0, runs = (width + 7) / 8, n = (r1 - r0) * runs;
  bool vec = false;
  if constexpr (std::is_same<T, __nv_bfloat16>::value && std::is_same<TO, __nv_bfloat16>::value &&
                sizeof(Acc) == 4) {
    vec = xent_vec_ok(x, V) && xent_vec_ok(dx, V) && (c0 % 8 == 0) && (width % 8 == 0);
  }
  if (vec) {
    // XENT_RUNS runs (of 8 BF16 logits) per thread per iteration, every load (the logits, the row's
    // target and lse) issued before any math or store: 256 threads x 4 x 16 B = 16 KiB of logits
    // in flight per SM (run 14 measured two runs, with the row's scalars loaded after the logits,
    // at ~7 GB/s per SM: latency-bound). The (row, run) decomposition is one division per run.
    constexpr int XENT_RUNS = 4;
    const float sc = (float)scale;
    for (long long i0 = threadIdx.x; i0 < n; i0 += XENT_RUNS * LATCH_THREADS) {
      uint4 u[XENT_RUNS];
      long long r[XENT_RUNS], j0[XENT_RUNS], t[XENT_RUNS];
      float l[XENT_RUNS];
#pragma unroll
      for (int q = 0; q < XENT_RUNS; ++q) {
        const long long i = i0 + q * LATCH_THREADS;
        const long long rr = i / runs;
        r[q] = r0 + rr;
        j0[q] = c0 + (i - rr * runs) * 8;
        if (i < n) {
          u[q] = *reinterpret_cast<const uint4*>(x + r[q] * V + j0[q]);
          t[q] = (long long)target[r[q]];
          l[q] = (float)ld<TS>(lse, r[q]);
        }
      }
#pragma unroll
      for (int q = 0; q < XENT_RUNS; ++q) {
        if (i0 + q * LATCH_THREADS >= n) break;
        const bool ok = t[q] != ignore_index;
        float f[8];
        bf16x8_to_float(u[q], f);
        uint4 o;
        __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const long long ja = j0[q] + 2 * k;
          const float a = ok ? (ew::exp_(f[2 * k] - l[q]) - (ja == t[q] ? 1.f : 0.f)) * sc : 0.f;
          const float b = ok ? (ew::exp_(f[2 * k + 1] - l[q]) - (ja + 1 == t[q] ? 1.f : 0.f)) * sc : 0.f;
          h[k] = __floats2bfloat162_rn(a, b);
        }
        *reinterpret_cast<uint4*>(dx + r[q] * V + j0[q]) = o;
      }
    }
    return;
  }
  for (long long i = threadIdx.x; i < n; i += LATCH_THREADS) {
    const long long r = r0 + i / runs, j0 = c0 + (i % runs) * 8;
    const long long t = (long long)target[r];
    const bool ok = t != ignore_index;
    const Acc l = (Acc)ld<TS>(lse, r);
    const long long j1 = j0 + 8 < c1 ? j0 + 8 : c1;
    for (long long j = j0; j < j1; ++j) {
      const Acc v = ok ? (ew::exp_((Acc)ld<T>(x, r * V + j) - l) - (j == t ? Acc(1) : Acc(0))) * scale : Acc(0);
      st<TO>(dx, r * V + j, v);
    }
  }
}

}  // namespace latch

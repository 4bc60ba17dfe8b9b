// Cross-entropy over stored logits (latch_ops/cross_entropy.py): the LM head's row statistics and
// its logits gradient, each one pass over the logits.
//
//   cross_entropy_row:      one warp, one row: online (max, sum exp) over V, then lse, the target's
//                           nll and the valid flag (lane 0 writes them). Deterministic: each lane
//                           walks its columns in order, the warp combines in a fixed butterfly.
//   cross_entropy_grad_tile: a row at a time, the consumer threads over its chunks of 8 elements:
//                           (exp(x - lse) - onehot) * scale, or 0 on an ignored row.
// BF16, FP16 or FP32 logits (and dlogits) with rows a multiple of 8 long and 16-byte aligned take
// 16-byte global loads and stores, 8 loads in flight per thread and bulk L2 prefetches ahead
// (results/ce.md); anything else a coalesced scalar path. Plain (coherent) loads,
// never ld.global.nc: the logits are written earlier in the same launch, into arena bytes that may
// have held another value before. Statistics in Acc (float; double for f64 logits); the float exp
// is ex2.approx of one FMA (xent_exp).
#pragma once

#include <type_traits>

#include "latch_elementwise.cuh"
#include "latch_pipe.cuh"

namespace latch {

// exp(v - l) for the float paths as one FFMA and one MUFU.EX2: ex2.approx(v * log2e - l * log2e).
// Relative error ~2^-22 (the FMA rounds once, ex2.approx is within 2 ulp): far under BF16's 2^-9 and
// the FP32 gate (1e-5 relative L2); torch's own CUDA softmax uses the same instruction. Results
// below 2^-126 flush to 0. Double stays ::exp. ``nl`` is -l * log2e, computed once per row.
__device__ __forceinline__ float xent_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float XENT_LOG2E = 1.4426950408889634f;
__device__ __forceinline__ float xent_exp(float v, float nl) { return xent_ex2(fmaf(v, XENT_LOG2E, nl)); }
__device__ __forceinline__ double xent_exp(double v, double nl) { return ::exp(v + nl); }
template <class Acc> __device__ __forceinline__ Acc xent_neg_scale(Acc l) {
  if constexpr (std::is_same<Acc, float>::value) return -l * XENT_LOG2E;
  else return -l;
}

template <class Acc>
__device__ __forceinline__ void xent_online(Acc v, Acc& m, Acc& s) {
  if (v != v) {
    m = v;  // NaN poisons the row, as in torch
  } else if (v > m) {
    s = s * xent_exp(m, xent_neg_scale(v)) + Acc(1);
    m = v;
  } else if (v != lowest<Acc>()) {
    s += xent_exp(v, xent_neg_scale(m));
  }
}

// Eight values at once: one rescale per chunk (at its max) instead of a branch per element. A NaN
// element makes s NaN (fmaxf skips it, exp does not), so the row's lse is NaN, as in torch.
__device__ __forceinline__ void xent_online8(const float* f, float& m, float& s) {
  float cm = f[0];
#pragma unroll
  for (int k = 1; k < 8; ++k) cm = fmaxf(cm, f[k]);
  if (cm > m) {
    s = m == lowest<float>() ? 0.f : s * xent_exp(m, xent_neg_scale(cm));
    m = cm;
  }
  if (m == lowest<float>()) return;  // every value so far is -inf: nothing to add
  const float nm = xent_neg_scale(m);
#pragma unroll
  for (int k = 0; k < 8; ++k) s += xent_exp(f[k], nm);
}

template <class Acc>
__device__ __forceinline__ void xent_combine(Acc& m, Acc& s, Acc m2, Acc s2) {
  if (m != m || m2 != m2) {
    m = m != m ? m : m2;
    return;
  }
  const Acc mm = m > m2 ? m : m2;
  const Acc nm = xent_neg_scale(mm);
  s = (m == lowest<Acc>() ? Acc(0) : s * xent_exp(m, nm)) + (m2 == lowest<Acc>() ? Acc(0) : s2 * xent_exp(m2, nm));
  m = mm;
}

__device__ __forceinline__ bool xent_vec_ok(const void* p, long long n) {
  return ((reinterpret_cast<uintptr_t>(p) & 15) == 0) && (n % 8 == 0);
}

// 16-byte global accesses. The pointers reach a body as generic addresses (Ctx::ops), so plain C++
// compiles to generic LD.E.128 / ST.E.128; these are LDG.E.128 / STG.E.128. Coherent (no .nc): the
// logits are written earlier in the same launch. Not volatile: the compiler may batch them.
__device__ __forceinline__ uint4 xent_ldg16(const void* p) {
  uint4 u;
  asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p) : "memory");
  return u;
}
__device__ __forceinline__ void xent_stg16(void* p, const uint4& u) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w) : "memory");
}

// Eight consecutive elements of T as raw 16-byte words: one for 16-bit types, two for float.
template <class T> struct Raw8 {
  static constexpr int W = sizeof(T) / 2;
  uint4 w[W];
  __device__ __forceinline__ void load(const T* p) {
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = xent_ldg16(reinterpret_cast<const char*>(p) + 16 * k);
  }
  __device__ __forceinline__ void to_float(float* f) const {
    if constexpr (std::is_same<T, float>::value) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        f[4 * k] = __uint_as_float(w[k].x);
        f[4 * k + 1] = __uint_as_float(w[k].y);
        f[4 * k + 2] = __uint_as_float(w[k].z);
        f[4 * k + 3] = __uint_as_float(w[k].w);
      }
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w[0]);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 v = __bfloat1622float2(h[k]);
        f[2 * k] = v.x;
        f[2 * k + 1] = v.y;
      }
    } else {
      const __half2* h = reinterpret_cast<const __half2*>(&w[0]);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 v = __half22float2(h[k]);
        f[2 * k] = v.x;
        f[2 * k + 1] = v.y;
      }
    }
  }
};

// Eight floats stored as TO at p (16-byte aligned): one 16-byte store for 16-bit TO, two for float.
template <class TO>
__device__ __forceinline__ void xent_store8(TO* p, const float* f) {
  if constexpr (std::is_same<TO, float>::value) {
#pragma unroll
    for (int k = 0; k < 2; ++k)
      xent_stg16(p + 4 * k, make_uint4(__float_as_uint(f[4 * k]), __float_as_uint(f[4 * k + 1]),
                                       __float_as_uint(f[4 * k + 2]), __float_as_uint(f[4 * k + 3])));
  } else {
    uint4 o;
    if constexpr (std::is_same<TO, __nv_bfloat16>::value) {
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
      for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    } else {
      __half2* h = reinterpret_cast<__half2*>(&o);
#pragma unroll
      for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
    }
    xent_stg16(p, o);
  }
}

template <class T> __host__ __device__ constexpr bool xent_vec_type() {
  return std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value || std::is_same<T, float>::value;
}

// Bytes in flight: XENT_WORDS 16-byte loads per thread before any math (8 x 16 B x 256 consumer
// threads = 32 KiB per SM; 16 spill once a kernel holds several of these bodies), plus L2
// prefetches (cp.async.bulk.prefetch.L2: no registers) of the bytes ahead (the forward: the next
// XENT_AHEAD iterations' of each warp's row; the backward: the next row of the tile), so that
// ~96 KiB per SM are on their way from HBM. Runs 14 and 26 measured 8 and 16 KiB in flight at
// ~7 and ~13 GB/s per SM (latency-bound), where 4.27 TB/s over 128 SMs needs 33 GB/s each.
constexpr int XENT_WORDS = 8;
constexpr int XENT_AHEAD = 2;

// A hint: bytes [p, p + bytes) into L2 (p and bytes multiples of 16). Coherent: L2 is where every
// SM's writes meet, so a prefetched line is never stale.
__device__ __forceinline__ void xent_prefetch_l2(const void* p, long long bytes) {
  if (bytes > 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"((unsigned)bytes) : "memory");
}

template <class T, class Acc>
__device__ __forceinline__ void xent_row_stats(const T* x, long long V, Acc& m, Acc& s) {
  const int lane = threadIdx.x & 31;
  m = lowest<Acc>();
  s = Acc(0);
  bool scalar = true;
  if constexpr (xent_vec_type<T>() && std::is_same<Acc, float>::value) {
    if (xent_vec_ok(x, V)) {
      scalar = false;
      constexpr int U = XENT_WORDS / Raw8<T>::W;  // chunks of 8 per lane in flight
      const int n8 = (int)(V / 8);
      int j = lane;
      // lane 0 prefetches the warp's next iterations (32 U chunks each) into L2
      auto ahead = [&](int from) {
        if (lane == 0 && from < n8)
          xent_prefetch_l2(x + 8LL * from, 16LL * Raw8<T>::W * ((from + 32 * U < n8 ? from + 32 * U : n8) - from));
      };
#pragma unroll
      for (int a = 1; a < XENT_AHEAD; ++a) ahead(32 * U * a);
      for (; j + 32 * (U - 1) < n8; j += 32 * U) {
        ahead(j - lane + 32 * U * XENT_AHEAD);
        Raw8<T> u[U];
#pragma unroll
        for (int q = 0; q < U; ++q) u[q].load(x + 8LL * (j + 32 * q));
#pragma unroll
        for (int q = 0; q < U; ++q) {
          float f[8];
          u[q].to_float(f);
          xent_online8(f, m, s);
        }
      }
      for (; j < n8; j += 32) {
        Raw8<T> u;
        u.load(x + 8LL * j);
        float f[8];
        u.to_float(f);
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

// The backward's scale: the incoming gradient of the loss, over the count of valid rows for a mean.
// Both backward bodies (the register path and the ring path) take it from here: the same bits.
template <class TS, class Acc> __device__ __forceinline__ Acc xent_grad_scale(const TS* grad, const TS* total, bool mean) {
  return mean ? (Acc)ld<TS>(grad, 0) / (Acc)ld<TS>(total, 0) : (Acc)ld<TS>(grad, 0);
}

// One chunk of 8 logits (as floats, in place) -> its dlogits before rounding: exp(x - lse) * sc, and
// at the target's place (when the chunk holds it) (exp(x - lse) - 1) * sc. The register path and the
// ring path (cross_entropy_grad_ring) both call it, so the two give the same bits.
__device__ __forceinline__ void xent_grad8(float* f, float nl, float sc, bool at_target, int hit) {
  if (!at_target) {
#pragma unroll
    for (int k = 0; k < 8; ++k) f[k] = xent_exp(f[k], nl) * sc;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) f[k] = (xent_exp(f[k], nl) - (k == hit ? 1.f : 0.f)) * sc;
  }
}

// The tile [r0, r1) x [c0, c1) of dlogits = (exp(x - lse) - onehot(t)) * scale, 0 on an ignored row.
// Vector path (16-bit or float logits and dx, rows a multiple of 8 long, 16-byte aligned, the tile's
// columns whole chunks of 8): a row at a time (P rows at once where a row has fewer chunks of 8 than
// there are consumer threads), its chunks spread over the threads, XENT_WORDS 16-byte logit loads in
// flight per thread before any math; the next row L2-prefetched (cp.async.bulk.prefetch.L2) as a row
// starts. Per row, once: its target chunk, its lse, whether it is ignored (a whole ignored row is
// stored as zeros without reading its logits). Per chunk: a 32-bit offset from the row's base, and
// per element one FFMA, one MUFU.EX2 and one FMUL (run 29's body spent ~140 instructions a chunk on
// per-element selects for the one-hot and the ignore, a per-chunk row cursor and 64-bit target
// arithmetic: 287 us a task, ~6 us an iteration for 32 KiB per SM: issue-bound). The chunk holding
// the target takes a branch (one chunk of a row) that subtracts the one at its place. Every element is
// computed by the formula the scalar path writes, in every run and tiling: (e - 0) * sc is e * sc to
// the bit, (e - 1) * sc at the target; deterministic.
template <class T, class TI, class TS, class TO, class Acc>
__device__ __forceinline__ void cross_entropy_grad_tile(const TS* grad, const T* x, const TI* target, const TS* lse,
                                                        const TS* total, TO* dx, long long V, long long r0,
                                                        long long r1, long long c0, long long c1,
                                                        long long ignore_index, bool mean) {
  const Acc scale = xent_grad_scale<TS, Acc>(grad, total, mean);
  const long long width = c1 - c0;
  if (r1 <= r0 || width <= 0) return;
  bool vec = false;
  if constexpr (xent_vec_type<T>() && xent_vec_type<TO>() && std::is_same<Acc, float>::value) {
    // a row's chunks are counted in 32 bits (offsets 16 * chunk bytes from the row's base)
    vec = xent_vec_ok(x, V) && xent_vec_ok(dx, V) && (c0 % 8 == 0) && (width % 8 == 0) &&
          width / 8 < (1LL << 26);
  }
  if (vec) {
    // FP32 logits: 3 chunks (6 words), not 4: with 4 the FP32 bodies spilled in a kernel of 14 bodies
    // (results/ce.md; FP32 -> BF16 still saves 16 words there, a pair no model makes)
    constexpr int U = Raw8<T>::W == 1 ? XENT_WORDS : 3;
    const int runs = (int)(width / 8), rows = (int)(r1 - r0);
    const float sc = (float)scale;
    // L threads per row, P rows at once; threads past P * L (when L does not divide them) sit out
    const int L = runs < LATCH_THREADS ? runs : LATCH_THREADS, P = LATCH_THREADS / L;
    const int p = (int)threadIdx.x / L, l = (int)threadIdx.x - p * L;
    if (p >= P) return;
    const long long row_bytes = 16LL * Raw8<T>::W * runs;
    for (int r = p; r < rows; r += P) {
      const long long row = r0 + r;
      if (l == 0 && r + P < rows) xent_prefetch_l2(x + (row + P) * V + c0, row_bytes);
      TO* drow = dx + row * V + c0;
      const long long t = (long long)target[row];
      if (t == ignore_index) {  // an ignored row: zeros, its logits never read
        const float z[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int j = l; j < runs; j += L) xent_store8<TO>(drow + 8 * j, z);
        continue;
      }
      // the chunk holding the target, and its place in it (-1: the target is not in this tile)
      const unsigned long long tc = (unsigned long long)(t - c0);
      const int tchunk = tc < (unsigned long long)width ? (int)(tc >> 3) : -1, hit = (int)(tc & 7);
      const float nl = xent_neg_scale((float)ld<TS>(lse, row));
      const T* xrow = x + row * V + c0;
      for (int j0 = l; j0 < runs; j0 += U * L) {
        Raw8<T> u[U];
#pragma unroll
        for (int q = 0; q < U; ++q) {
          const int j = j0 + q * L;
          if (j < runs) u[q].load(xrow + 8 * j);
        }
#pragma unroll
        for (int q = 0; q < U; ++q) {
          const int j = j0 + q * L;
          if (j >= runs) break;
          float f[8];
          u[q].to_float(f);
          xent_grad8(f, nl, sc, j == tchunk, hit);
          xent_store8<TO>(drow + 8 * j, f);
        }
      }
    }
    return;
  }
  // Scalar path (odd V, misaligned, a column tile not in chunks of 8, f64): a row at a time, the
  // consumer threads over its columns (coalesced); the row's target and lse loaded once.
  for (long long r = r0; r < r1; ++r) {
    const long long t = (long long)target[r];
    const bool ok = t != ignore_index;
    const Acc nl = xent_neg_scale((Acc)ld<TS>(lse, r));
    for (long long j = c0 + threadIdx.x; j < c1; j += LATCH_THREADS) {
      const Acc v = ok ? (xent_exp((Acc)ld<T>(x, r * V + j), nl) - (j == t ? Acc(1) : Acc(0))) * scale : Acc(0);
      st<TO>(dx, r * V + j, v);
    }
  }
}

// ---- the ring path of the backward (issue 11, results/xb.md) ----------------------------------------
// 16-bit logits stream through the kernel's ring of shared-memory stages: the producer thread
// (cross_entropy_grad_produce) fills a stage with a contiguous piece of one row by TMA, up to the
// whole ring ahead of the consumers (the register path above has 32 KiB per SM in flight and none
// during its math: run 32, 220 us a task, ~14 GB/s per SM); the consumers
// (cross_entropy_grad_ring) wait for the stage, read their 16-byte chunks from it, release it at
// once, then compute (xent_grad8, the register path's math: the same bits) and store 16 bytes.
//
// The tensor map views logits [N, V] as (W, V / W, N) (innermost first), W = min(256, the largest
// power of two dividing V): a box (W, BOXK, 1) is BOXK * W consecutive elements of one row, and a
// box reaching past the row's end reads zeros (the map's bounds), never the next row. A stage holds
// NB such boxes back to back: SE = NB * W * BOXK consecutive elements of a row from column
// c0 + k * SE. Both halves walk the same stages: for each row of the tile that is not ignored (an
// ignored row is stored as zeros by the consumers and never loaded), its pieces in order.
// Taken at run time only where xent_ring_ok holds (the tile's columns start at a multiple of W and
// are whole chunks of 8, dlogits 16-byte aligned); both halves evaluate it on the same tile, and
// where it fails the producer loads nothing and the consumers run the register path.

// Elements of one box, and the boxes of a stage: at most 48 KiB of 16-bit logits a stage (12
// chunks per consumer thread held in registers between its reads and its stores).
constexpr int XENT_RING_ROUND = 4;  // chunks of a stage a consumer thread holds in registers at once
template <int W, int BOXK> __host__ __device__ constexpr int xent_box_elems() { return W * BOXK; }
template <int W, int BOXK, int STAGE> __host__ __device__ constexpr int xent_stage_boxes() {
  return (STAGE / (2 * W * BOXK)) < (24576 / (W * BOXK)) ? (STAGE / (2 * W * BOXK)) : (24576 / (W * BOXK));
}

template <int W>
__device__ __forceinline__ bool xent_ring_ok(const void* dx, long long V, long long r0, long long r1, long long c0,
                                             long long c1) {
  return r1 > r0 && c1 > c0 && c0 % W == 0 && (c1 - c0) % 8 == 0 && c1 <= V && r1 < (1LL << 31) &&
         (reinterpret_cast<uintptr_t>(dx) & 15) == 0;
}

// Read a 16-byte word of a stage (ld.shared: the ring pointer is generic in C++).
__device__ __forceinline__ uint4 xent_lds16(const char* p) {
  uint4 u;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
               : "r"(sm90::smem_addr(p))
               : "memory");
  return u;
}

// The producer half (one thread): TMA loads of the tile's rows into the ring. False when a wait was
// aborted (the launch's abort flag, or a timeout it recorded).
template <class T, class TI, int W, int BOXK, int STAGE>
__device__ __forceinline__ bool cross_entropy_grad_produce(Pipe& p, const void* map, const TI* target, const void* dx,
                                                           long long V, long long r0, long long r1, long long c0,
                                                           long long c1, long long ignore_index) {
  static_assert(sizeof(T) == 2, "the ring path takes 16-bit logits");
  constexpr int BOXE = xent_box_elems<W, BOXK>(), NB = xent_stage_boxes<W, BOXK, STAGE>(), SE = NB * BOXE;
  constexpr uint32_t BOX_BYTES = 2u * BOXE;
  static_assert(NB >= 1, "a ring stage smaller than one box (the lowering's stage_bytes)");
  if (!xent_ring_ok<W>(dx, V, r0, r1, c0, c1)) return true;
  const long long width = c1 - c0;
  const int j0 = (int)(c0 / W);
  for (long long row = r0; row < r1; ++row) {
    const long long t = (long long)target[row];
    // the first stage of the row; waiting for it before the test hides the target's load (an
    // ignored row takes no stage, and the next row finds this one free at once)
    if (!pipe_wait(&p.empty[p.stage], p.phase ^ 1u, p)) return false;
    if (t == ignore_index) continue;
    for (long long pc = 0; pc < width; pc += SE) {
      if (pc > 0 && !pipe_wait(&p.empty[p.stage], p.phase ^ 1u, p)) return false;
      const long long left = width - pc;
      const int nb = left >= SE ? NB : (int)((left + BOXE - 1) / BOXE);
      char* st = p.at(p.stage);
      uint64_t* full = &p.full[p.stage];
      // a box past the row's end still counts all its bytes (TMA fills them with zeros)
      sm90::mbar_arrive_expect_tx(full, BOX_BYTES * (uint32_t)nb);
      const int j = j0 + (int)(pc / W);
      for (int b = 0; b < nb; ++b) sm90::tma_load_3d(st + BOX_BYTES * b, map, full, 0, j + BOXK * b, (int)row);
      p.advance();
    }
  }
  return true;
}

// The register body out of line, for the ring body's tiles it cannot take (rare: column tiles off
// the map's pieces): a ring body is compiled into the kernel's dispatch, and a second copy of the
// register body inlined beside each one made a 22-body test kernel spill 280 bytes.
template <class T, class TI, class TS, class TO>
__device__ __noinline__ void cross_entropy_grad_tile_outlined(const TS* grad, const T* x, const TI* target,
                                                              const TS* lse, const TS* total, TO* dx, long long V,
                                                              long long r0, long long r1, long long c0, long long c1,
                                                              long long ignore_index, bool mean) {
  cross_entropy_grad_tile<T, TI, TS, TO, float>(grad, x, target, lse, total, dx, V, r0, r1, c0, c1, ignore_index, mean);
}

// The consumer half: the tile [r0, r1) x [c0, c1) of dlogits from the ring (the register path,
// cross_entropy_grad_tile, where xent_ring_ok fails). False when a wait was aborted.
template <class T, class TI, class TS, class TO, int W, int BOXK, int STAGE>
__device__ __forceinline__ bool cross_entropy_grad_ring(Pipe& p, const TS* grad, const T* x, const TI* target,
                                                        const TS* lse, const TS* total, TO* dx, long long V,
                                                        long long r0, long long r1, long long c0, long long c1,
                                                        long long ignore_index, bool mean) {
  static_assert(sizeof(T) == 2, "the ring path takes 16-bit logits");
  if (!xent_ring_ok<W>(dx, V, r0, r1, c0, c1)) {
    cross_entropy_grad_tile_outlined<T, TI, TS, TO>(grad, x, target, lse, total, dx, V, r0, r1, c0, c1, ignore_index,
                                                    mean);
    return true;
  }
  constexpr int SE = xent_stage_boxes<W, BOXK, STAGE>() * xent_box_elems<W, BOXK>();
  constexpr int CH = SE / 8 / LATCH_THREADS;  // chunks of 8 a consumer thread takes from a full stage
  static_assert(SE % (8 * LATCH_THREADS) == 0, "a stage is whole rounds of the consumer threads' chunks");
  const float sc = xent_grad_scale<TS, float>(grad, total, mean);  // as the register path computes it
  const int tid = (int)threadIdx.x, lane = tid & 31;
  const long long width = c1 - c0;
  const int runs = (int)(width / 8);
  // the row's target and lse, loaded one row ahead (their latency off the rows' critical path)
  long long t = (long long)target[r0];
  float lv = (float)ld<TS>(lse, r0);
  for (long long row = r0; row < r1; ++row) {
    const bool more = row + 1 < r1;
    const long long t_next = more ? (long long)target[row + 1] : 0;
    const float l_next = more ? (float)ld<TS>(lse, row + 1) : 0.f;
    TO* drow = dx + row * V + c0;
    if (t == ignore_index) {  // zeros, no stage (the producer loaded nothing for it)
      const float z[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int j = tid; j < runs; j += LATCH_THREADS) xent_store8<TO>(drow + 8 * j, z);
    } else {
      const unsigned long long tc = (unsigned long long)(t - c0);
      const int tchunk = tc < (unsigned long long)width ? (int)(tc >> 3) : -1, hit = (int)(tc & 7);
      const float nl = xent_neg_scale(lv);
      for (int j0 = 0; j0 < runs; j0 += SE / 8) {
        const int n = runs - j0 < SE / 8 ? runs - j0 : SE / 8;  // chunks in this stage
        if (!pipe_wait_warp(&p.full[p.stage], p.phase, p)) return false;
        const char* st = p.at(p.stage);
        uint64_t* empty = &p.empty[p.stage];
        // XENT_RING_ROUND chunks a round held in registers: 12 (a 48 KiB stage at once) spilled
        // them to local memory in TinyMoE-200M's kernel (168 registers for every inlined body).
        // The stage goes back to the producer right after the last round's reads, before its math.
#pragma unroll 1
        for (int q0 = 0; q0 < CH; q0 += XENT_RING_ROUND) {
          uint4 u[XENT_RING_ROUND];
#pragma unroll
          for (int q = 0; q < XENT_RING_ROUND; ++q) {
            const int i = tid + LATCH_THREADS * (q0 + q);  // >= n past the stage's chunks
            if (i < n) u[q] = xent_lds16(st + 16 * i);
          }
          if (q0 + XENT_RING_ROUND >= CH) {
            __syncwarp();
            if (lane == 0) sm90::mbar_arrive(empty);
          }
#pragma unroll
          for (int q = 0; q < XENT_RING_ROUND; ++q) {
            const int i = tid + LATCH_THREADS * (q0 + q);
            if (i >= n) break;
            Raw8<T> w;  // the register path's unpacking
            w.w[0] = u[q];
            float f[8];
            w.to_float(f);
            xent_grad8(f, nl, sc, j0 + i == tchunk, hit);
            xent_store8<TO>(drow + 8 * (j0 + i), f);
          }
        }
        p.advance();
      }
    }
    t = t_next;
    lv = l_next;
  }
  return true;
}

}  // namespace latch

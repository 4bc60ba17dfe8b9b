// Attention bodies on the tensor cores (mma.sync m16n8k16, BF16 operands, FP32 accumulation):
// latch::sdpa forward (flash: online softmax, lse saved) and latch::sdpa_backward (P rebuilt
// from lse), for BF16 storage (or FP32 storage with BF16 operands) and head dims D = Dv in {64, 128}; the same semantics as
// latch_ops/attention.py (causal = top-left aligned: key j > query i is masked).
//
// Tiles: blocks of 64 keys (and, in the backward, 64 queries) staged in the body's scratch shared
// memory as row-major [64][D + 8] BF16 (the 8 pad elements move each row by 16 bytes across the
// banks). Fragment layouts of m16n8k16 (g = lane / 4, t = lane % 4): A a0 (row g, k 2t..2t+1),
// a1 (row g+8), a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..); B b0 (k 2t..2t+1, col g), b1 (k
// 2t+8..); C c0 c1 (row g, cols 2t, 2t+1), c2 c3 (row g+8). A product's C fragments of two
// adjacent n8 tiles are, rounded to BF16, the A fragment of the next product (P @ V, dS @ K).
//
// Determinism: no atomics. Where two warps hold partial sums of one output (the backward splits a
// 64 x 64 score tile into 16 x 32 per warp), the partials meet in shared memory and are added in
// warp order, the same on every run.
#pragma once

#include "latch_common.cuh"

namespace latch {
namespace amma {

constexpr int BK = 64;  // rows of a staged key (or query) block
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

#ifndef LATCH_EMULATED_MMA  // the CPU test (tests/attention_emulator) brings its own model of the warp
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// 16 bytes global -> shared without passing through registers (sm_80+ cp.async, L2 only); the
// destination is zero-filled where ``valid`` is false (``src`` must still be a mapped address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
#endif

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t pack_raw(unsigned short lo, unsigned short hi) {
  return (uint32_t)lo | ((uint32_t)hi << 16);
}

// Global operands are BF16 or FP32 (``operand_dtype="bf16"`` on FP32 values: rounded to BF16 as
// they are staged, so the products see what the policy says); the staged tiles are always BF16.
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ uint32_t ld_pair(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t ld_pair(const float* p) {
  const float2 f = *reinterpret_cast<const float2*>(p);
  return pack_bf16(f.x, f.y);
}
__device__ __forceinline__ void st_pair(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<uint32_t*>(p) = pack_bf16(a, b);
}
__device__ __forceinline__ void st_pair(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
// 8 elements into a staged tile: BF16 by cp.async, FP32 converted through registers (synchronous)
__device__ __forceinline__ void stage8(__nv_bfloat16* dst, const __nv_bfloat16* src, bool ok) { cp_async16(dst, src, ok); }
__device__ __forceinline__ void stage8(__nv_bfloat16* dst, const float* src, bool ok) {
  float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
  if (ok) {
    a = reinterpret_cast<const float4*>(src)[0];
    b = reinterpret_cast<const float4*>(src)[1];
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y),
                                              pack_bf16(b.z, b.w));
}

// A fragment at (m0, k0) of a row-major [m][k] tile with leading dimension LD (elements).
template <int LD>
__device__ __forceinline__ void frag_a(uint32_t* a, const __nv_bfloat16* t, int m0, int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const __nv_bfloat16* p = t + (m0 + g) * LD + k0 + 2 * q;
  a[0] = *reinterpret_cast<const uint32_t*>(p);
  a[1] = *reinterpret_cast<const uint32_t*>(p + 8 * LD);
  a[2] = *reinterpret_cast<const uint32_t*>(p + 8);
  a[3] = *reinterpret_cast<const uint32_t*>(p + 8 * LD + 8);
}

// B fragment (k0, n0) of B[k][n] = t[n][k] (t row-major [n][k]: keys as rows for Q K^T).
template <int LD>
__device__ __forceinline__ void frag_b_nk(uint32_t* b, const __nv_bfloat16* t, int n0, int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const __nv_bfloat16* p = t + (n0 + g) * LD + k0 + 2 * q;
  b[0] = *reinterpret_cast<const uint32_t*>(p);
  b[1] = *reinterpret_cast<const uint32_t*>(p + 8);
}

// B fragment (k0, n0) of B[k][n] = t[k][n] (t row-major [k][n]: V for P @ V), two 16-bit loads
// per register.
template <int LD>
__device__ __forceinline__ void frag_b_kn(uint32_t* b, const __nv_bfloat16* t, int k0, int n0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const unsigned short* p = reinterpret_cast<const unsigned short*>(t) + (k0 + 2 * q) * LD + n0 + g;
  b[0] = pack_raw(p[0], p[LD]);
  b[1] = pack_raw(p[8 * LD], p[9 * LD]);
}

// Rows [r, r + BK) of a row-major [T][D] matrix into a [BK][D + 8] BF16 tile, zeros past row T;
// BF16 rows as cp.async copies (complete after cp_async_wait and a block_sync).
template <int D, class S>
__device__ __forceinline__ void load_tile_async(__nv_bfloat16* tile, const S* src, long long r, long long T) {
  constexpr int LD = D + 8, VEC = D / 8;
  for (int i = threadIdx.x; i < BK * VEC; i += LATCH_THREADS) {
    const int row = i / VEC, c = i % VEC;
    const bool ok = r + row < T;
    stage8(tile + row * LD + c * 8, ok ? src + (r + row) * D + c * 8 : src, ok);
  }
}

// The double buffering of the (key, value) loops: buffer it & 1 holds block kb, its copies in flight.
// Start block kb + BK into the other buffer (read two iterations ago, so free after the last
// block_sync) when there is one, then wait for block kb's copies; a block_sync() after this makes
// them visible to every thread.
template <int D, class S>
__device__ __forceinline__ void next_kv_block(__nv_bfloat16* buf, const S* k, const S* v, long long kb,
                                              long long kend, long long Tk, long long it) {
  constexpr int LD = D + 8;
  if (kb + BK < kend) {
    __nv_bfloat16* nx = buf + ((it + 1) & 1) * 2 * BK * LD;
    load_tile_async<D>(nx, k, kb + BK, Tk);
    load_tile_async<D>(nx + BK * LD, v, kb + BK, Tk);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

// Per query row of a block: lse2[i] = lse_i log2(e) and dterm[i] = delta_i - glse_i, with
// delta_i = dO_i . O_i in FP32 (4 lanes per row); rows past T give 0.
template <int D, class S>
__device__ __forceinline__ void row_terms(float* lse2, float* dterm, const S* go, const S* o,
                                          const float* lse, const float* glse, long long r, long long T) {
  for (int i = threadIdx.x; i < BK * 4; i += LATCH_THREADS) {
    const int row = i >> 2, part = i & 3;
    const long long gr = r + row;
    float d = 0.f;
    if (gr < T)
      for (int e = part; e < D; e += 4) d += to_f(go[gr * D + e]) * to_f(o[gr * D + e]);
    d += __shfl_xor_sync(0xffffffffu, d, 1);
    d += __shfl_xor_sync(0xffffffffu, d, 2);
    if (part == 0) {
      lse2[row] = gr < T ? lse[gr] * LOG2E : 0.f;
      dterm[row] = gr < T ? d - (glse ? glse[gr] : 0.f) : 0.f;
    }
  }
}

// ---- forward ---------------------------------------------------------------------------------
// Query rows [r0, r1) (at most 8 x 16 = 128) of one (b, h): each warp owns 16 rows and runs the
// online softmax over blocks of 64 keys (causal: only blocks holding a visible key).
template <int D, bool CAUSAL, class S>
__device__ void sdpa_forward(const S* q, const S* k, const S* v, S* out, float* lse, long long r0, long long r1, long long Tq, long long Tk,
                             float scale, char* smem) {
  constexpr int LD = D + 8, KS = D / 16, NO = D / 8;
  // two buffers of (K, V) blocks: block i + 1 streams in (cp.async) while block i is computed
  __nv_bfloat16* buf = reinterpret_cast<__nv_bfloat16*>(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const long long m0 = r0 + 16 * warp;
  const long long row_a = m0 + g, row_b = m0 + g + 8;
  const float c2 = scale * LOG2E;
  uint32_t qf[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    const int kk = ks * 16 + 2 * t;
    qf[ks][0] = row_a < Tq ? ld_pair(q + row_a * D + kk) : 0u;
    qf[ks][1] = row_b < Tq ? ld_pair(q + row_b * D + kk) : 0u;
    qf[ks][2] = row_a < Tq ? ld_pair(q + row_a * D + kk + 8) : 0u;
    qf[ks][3] = row_b < Tq ? ld_pair(q + row_b * D + kk + 8) : 0u;
  }
  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_a = -inf(), m_b = -inf(), l_a = 0.f, l_b = 0.f;
  const long long kend = CAUSAL ? (r1 < Tk ? r1 : Tk) : Tk;
  block_sync();  // the scratch may still be read by the previous body
  load_tile_async<D>(buf, k, 0, Tk);
  load_tile_async<D>(buf + BK * LD, v, 0, Tk);
  cp_async_commit();
  for (long long kb = 0, it = 0; kb < kend; kb += BK, ++it) {
    const __nv_bfloat16* Ks = buf + (it & 1) * 2 * BK * LD;
    const __nv_bfloat16* Vs = Ks + BK * LD;
    next_kv_block<D>(buf, k, v, kb, kend, Tk, it);
    block_sync();
    // two halves of 32 keys, each a full online-softmax step (keeps S at 16 registers)
#pragma unroll 1
    for (int hf = 0; hf < 2; ++hf) {
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        uint32_t b[2];
        frag_b_nk<LD>(b, Ks, hf * 32 + n * 8, ks * 16);
        mma16816(s[n], qf[ks], b);
      }
    float mx_a = -inf(), mx_b = -inf();
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const long long col = kb + hf * 32 + n * 8 + 2 * t + (e & 1);
        const long long row = e < 2 ? row_a : row_b;
        const bool ok = col < Tk && (!CAUSAL || col <= row);
        s[n][e] = ok ? s[n][e] * c2 : -inf();
        if (e < 2) mx_a = fmaxf(mx_a, s[n][e]);
        else mx_b = fmaxf(mx_b, s[n][e]);
      }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
    }
    const float nm_a = fmaxf(m_a, mx_a), nm_b = fmaxf(m_b, mx_b);
    // a row with no visible key yet keeps m = -inf: use 0 as its offset (every p is 0 then)
    const float u_a = nm_a == -inf() ? 0.f : nm_a, u_b = nm_b == -inf() ? 0.f : nm_b;
    const float al_a = exp2f(m_a - u_a), al_b = exp2f(m_b - u_b);
    m_a = nm_a;
    m_b = nm_b;
    l_a *= al_a;
    l_b *= al_b;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      o[n][0] *= al_a;
      o[n][1] *= al_a;
      o[n][2] *= al_b;
      o[n][3] *= al_b;
    }
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      s[n][0] = exp2f(s[n][0] - u_a);
      s[n][1] = exp2f(s[n][1] - u_a);
      s[n][2] = exp2f(s[n][2] - u_b);
      s[n][3] = exp2f(s[n][3] - u_b);
      l_a += s[n][0] + s[n][1];
      l_b += s[n][2] + s[n][3];
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint32_t a[4] = {pack_bf16(s[2 * j][0], s[2 * j][1]), pack_bf16(s[2 * j][2], s[2 * j][3]),
                       pack_bf16(s[2 * j + 1][0], s[2 * j + 1][1]), pack_bf16(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        uint32_t b[2];
        frag_b_kn<LD>(b, Vs, hf * 32 + j * 16, n * 8);
        mma16816(o[n], a, b);
      }
    }
    }
    block_sync();  // every warp is done with this buffer before it is refilled
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
  }
  const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
  const bool st_a = row_a < r1 && row_a < Tq, st_b = row_b < r1 && row_b < Tq;
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    const int col = n * 8 + 2 * t;
    if (st_a) st_pair(out + row_a * D + col, o[n][0] * inv_a, o[n][1] * inv_a);
    if (st_b) st_pair(out + row_b * D + col, o[n][2] * inv_b, o[n][3] * inv_b);
  }
  if (lse && t == 0) {
    if (st_a) lse[row_a] = (m_a + log2f(l_a)) * LN2;
    if (st_b) lse[row_b] = (m_b + log2f(l_b)) * LN2;
  }
}

// ---- backward --------------------------------------------------------------------------------
// Scratch: six [64][D + 8] BF16 tiles, then 4 x 64 floats of per-row terms. dq: queries and dO
// fixed, two buffers of (keys, values); dk/dv: keys and values fixed, two buffers of (queries,
// dO) with their lse2/dterm rows. The next block streams in (cp.async) while one is computed.
// The partial sums reuse the tiles' bytes as FP32 [64][D] arrays.
template <int D>
constexpr int backward_smem() {
  return 6 * BK * (D + 8) * 2 + 4 * BK * 4;
}

// Warp w of the 8: rows 16 (w % 4) .. of the block's M side, columns 32 (w / 4) .. of its N side.
// The two warps of one row group hold partials of the same output rows; warps 4..7 hand theirs
// to warps 0..3 through shared memory (fixed order).
template <int NO>
__device__ __forceinline__ void combine_partials(float (*acc)[4], float* part, int D) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int rg = warp & 3, ch = warp >> 2;
  float* base = part + (16 * rg + g) * D + 2 * t;
  block_sync();
  if (ch == 1) {
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      base[n * 8] = acc[n][0];
      base[n * 8 + 1] = acc[n][1];
      base[8 * D + n * 8] = acc[n][2];
      base[8 * D + n * 8 + 1] = acc[n][3];
    }
  }
  block_sync();
  if (ch == 0) {
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      acc[n][0] += base[n * 8];
      acc[n][1] += base[n * 8 + 1];
      acc[n][2] += base[8 * D + n * 8];
      acc[n][3] += base[8 * D + n * 8 + 1];
    }
  }
}

template <int NO, class S>
__device__ __forceinline__ void store_rows(S* dst, float (*acc)[4], float mul, long long row0,
                                           long long rend, int D) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const long long ra = row0 + g, rb = row0 + g + 8;
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    const int col = n * 8 + 2 * t;
    if (ra < rend) st_pair(dst + ra * D + col, acc[n][0] * mul, acc[n][1] * mul);
    if (rb < rend) st_pair(dst + rb * D + col, acc[n][2] * mul, acc[n][3] * mul);
  }
}

// dq rows [r0, r1) (at most 64) of one (b, h): dq_i = scale sum_j dS_ij k_j over the key blocks
// row block r0.. sees. Pointers at the head (k, v at its key/value head).
template <int D, bool CAUSAL, class S>
__device__ void sdpa_dq(const S* go, const float* glse, const S* q, const S* k, const S* v, const S* o,
                        const float* lse, S* dq,
                        long long r0, long long r1, long long Tq, long long Tk, float scale, char* smem) {
  constexpr int LD = D + 8, KS = D / 16, NO = D / 8;
  __nv_bfloat16* T0 = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* T1 = T0 + BK * LD;
  __nv_bfloat16* KV = T1 + BK * LD;  // (keys, values) x 2 buffers
  float* lse2 = reinterpret_cast<float*>(KV + 4 * BK * LD);
  float* dterm = lse2 + BK;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int rg = warp & 3, ch = warp >> 2;
  const float c2 = scale * LOG2E;
  block_sync();
  load_tile_async<D>(T0, q, r0, Tq);
  load_tile_async<D>(T1, go, r0, Tq);
  load_tile_async<D>(KV, k, 0, Tk);
  load_tile_async<D>(KV + BK * LD, v, 0, Tk);
  cp_async_commit();
  row_terms<D>(lse2, dterm, go, o, lse, glse, r0, Tq);
  float acc[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  const int la = 16 * rg + g, lb = la + 8;  // the thread's two rows, local to the block
  const long long row_a = r0 + la, row_b = r0 + lb;
  const long long kend = CAUSAL ? (r1 < Tk ? r1 : Tk) : Tk;
  for (long long kb = 0, it = 0; kb < kend; kb += BK, ++it) {
    const __nv_bfloat16* T2 = KV + (it & 1) * 2 * BK * LD;
    const __nv_bfloat16* T3 = T2 + BK * LD;
    next_kv_block<D>(KV, k, v, kb, kend, Tk, it);
    block_sync();
    float s[4][4], dp[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t aq[4], ag[4];
      frag_a<LD>(aq, T0, 16 * rg, ks * 16);
      frag_a<LD>(ag, T1, 16 * rg, ks * 16);
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        uint32_t b[2];
        frag_b_nk<LD>(b, T2, 32 * ch + n * 8, ks * 16);
        mma16816(s[n], aq, b);
        frag_b_nk<LD>(b, T3, 32 * ch + n * 8, ks * 16);
        mma16816(dp[n], ag, b);
      }
    }
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const long long col = kb + 32 * ch + n * 8 + 2 * t + (e & 1);
        const long long row = e < 2 ? row_a : row_b;
        const int lr = e < 2 ? la : lb;
        const bool ok = col < Tk && (!CAUSAL || col <= row);
        const float p = ok ? exp2f(s[n][e] * c2 - lse2[lr]) : 0.f;
        s[n][e] = p * (dp[n][e] - dterm[lr]);  // dS
      }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint32_t a[4] = {pack_bf16(s[2 * j][0], s[2 * j][1]), pack_bf16(s[2 * j][2], s[2 * j][3]),
                       pack_bf16(s[2 * j + 1][0], s[2 * j + 1][1]), pack_bf16(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        uint32_t b[2];
        frag_b_kn<LD>(b, T2, 32 * ch + 16 * j, n * 8);
        mma16816(acc[n], a, b);
      }
    }
    block_sync();  // every warp is done with this buffer before it is refilled
  }
  cp_async_wait<0>();
  combine_partials<NO>(acc, reinterpret_cast<float*>(smem), D);
  if (ch == 0) store_rows<NO>(dq, acc, scale, r0 + 16 * rg, r1 < Tq ? r1 : Tq, D);
}

// One block of 64 keys (kb ..) of one key/value head: dk and/or dv (DK, DV) summed over the G
// query heads of its group (head order) and their query blocks (ascending). Query-head pointers at
// the group's first head; head h of the group is h * Tq * D elements on (h * Tq for lse, glse).
template <int D, bool CAUSAL, bool DK, bool DV, class S>
__device__ __forceinline__ void dkdv_block(const S* go, const float* glse, const S* q, const S* k, const S* v,
                                           const S* o, const float* lse, S* dk, S* dv, long long kb,
                                           long long k1, int G, long long Tq, long long Tk, float scale, char* smem) {
  constexpr int LD = D + 8, KS = D / 16, NO = D / 8;
  __nv_bfloat16* T2 = reinterpret_cast<__nv_bfloat16*>(smem);  // keys
  __nv_bfloat16* T3 = T2 + BK * LD;                              // values
  __nv_bfloat16* QB = T3 + BK * LD;                              // (queries, dO) x 2 buffers
  float* RT = reinterpret_cast<float*>(QB + 4 * BK * LD);        // (lse2, dterm) x 2 buffers
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int rg = warp & 3, ch = warp >> 2;
  const float c2 = scale * LOG2E;
  // block p of the (head, query block) sequence into buffer p & 1 (copies in flight; row terms done)
  auto issue = [&](int p, long long qstart, long long nq) {
    const int h = (int)(p / nq);
    const long long qb = qstart + (p % nq) * BK;
    __nv_bfloat16* dst = QB + (p & 1) * 2 * BK * LD;
    load_tile_async<D>(dst, q + (long long)h * Tq * D, qb, Tq);
    load_tile_async<D>(dst + BK * LD, go + (long long)h * Tq * D, qb, Tq);
    cp_async_commit();
    if (DK) {
      float* rt = RT + (p & 1) * 2 * BK;
      row_terms<D>(rt, rt + BK, go + (long long)h * Tq * D, o + (long long)h * Tq * D, lse + (long long)h * Tq,
                   glse ? glse + (long long)h * Tq : glse, qb, Tq);
    } else {  // dv needs only P: lse2
      float* rt = RT + (p & 1) * 2 * BK;
      for (int i = threadIdx.x; i < BK; i += LATCH_THREADS) rt[i] = qb + i < Tq ? lse[(long long)h * Tq + qb + i] * LOG2E : 0.f;
    }
  };
  block_sync();
  load_tile_async<D>(T2, k, kb, Tk);
  if (DK) load_tile_async<D>(T3, v, kb, Tk);
  float ak[NO][4], av[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) ak[n][e] = av[n][e] = 0.f;
  const long long key_a = kb + 16 * rg + g, key_b = key_a + 8;
  const long long qstart = CAUSAL ? kb / BK * BK : 0;
  const long long nq = qstart < Tq ? (Tq - qstart + BK - 1) / BK : 0;
  const int total = (int)(G * nq);
  if (total > 0) issue(0, qstart, nq);
  else cp_async_commit();
  for (int pi = 0; pi < total; ++pi) {
    const long long qb = qstart + (pi % nq) * BK;
    const __nv_bfloat16* T0 = QB + (pi & 1) * 2 * BK * LD;  // queries
    const __nv_bfloat16* T1 = T0 + BK * LD;                // dO
    const float* lse2 = RT + (pi & 1) * 2 * BK;
    const float* dterm = lse2 + BK;
    if (pi + 1 < total) {
      issue(pi + 1, qstart, nq);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    block_sync();
    float s[4][4], dp[4][4];  // S^T, dP^T: 16 keys x 32 queries
#pragma unroll
    for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t akf[4], avf[4];
      frag_a<LD>(akf, T2, 16 * rg, ks * 16);
      if (DK) frag_a<LD>(avf, T3, 16 * rg, ks * 16);
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        uint32_t b[2];
        frag_b_nk<LD>(b, T0, 32 * ch + n * 8, ks * 16);
        mma16816(s[n], akf, b);
        if (DK) {
          frag_b_nk<LD>(b, T1, 32 * ch + n * 8, ks * 16);
          mma16816(dp[n], avf, b);
        }
      }
    }
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int lq = 32 * ch + n * 8 + 2 * t + (e & 1);
        const long long qi = qb + lq;
        const long long key = e < 2 ? key_a : key_b;
        const bool ok = qi < Tq && key < Tk && (!CAUSAL || key <= qi);
        const float p = ok ? exp2f(s[n][e] * c2 - lse2[lq]) : 0.f;
        s[n][e] = p;
        if (DK) dp[n][e] = p * (dp[n][e] - dterm[lq]);  // dS^T
      }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint32_t ap[4] = {pack_bf16(s[2 * j][0], s[2 * j][1]), pack_bf16(s[2 * j][2], s[2 * j][3]),
                        pack_bf16(s[2 * j + 1][0], s[2 * j + 1][1]), pack_bf16(s[2 * j + 1][2], s[2 * j + 1][3])};
      uint32_t ad[4] = {pack_bf16(dp[2 * j][0], dp[2 * j][1]), pack_bf16(dp[2 * j][2], dp[2 * j][3]),
                        pack_bf16(dp[2 * j + 1][0], dp[2 * j + 1][1]), pack_bf16(dp[2 * j + 1][2], dp[2 * j + 1][3])};
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        uint32_t b[2];
        if (DV) {
          frag_b_kn<LD>(b, T1, 32 * ch + 16 * j, n * 8);
          mma16816(av[n], ap, b);
        }
        if (DK) {
          frag_b_kn<LD>(b, T0, 32 * ch + 16 * j, n * 8);
          mma16816(ak[n], ad, b);
        }
      }
    }
    block_sync();  // every warp is done with this buffer before it is refilled
  }
  cp_async_wait<0>();
  const long long kend = k1 < Tk ? k1 : Tk;
  if (DK) combine_partials<NO>(ak, reinterpret_cast<float*>(smem), D);
  if (DV) combine_partials<NO>(av, reinterpret_cast<float*>(smem) + BK * D, D);
  if (ch == 0) {
    if (DK) store_rows<NO>(dk, ak, scale, kb + 16 * rg, kend, D);
    if (DV) store_rows<NO>(dv, av, 1.f, kb + 16 * rg, kend, D);
  }
}

// dk, dv rows [k0, k1) of one key/value head, in blocks of 64 keys (see dkdv_block). Head dim 128
// runs dv and dk as two passes over the queries (S recomputed once more) so that each pass's
// accumulators fit the registers (both at once spill); head dim 64 runs one pass.
template <int D, bool CAUSAL, class S>
__device__ void sdpa_dkdv(const S* go, const float* glse, const S* q, const S* k, const S* v, const S* o,
                          const float* lse, S* dk, S* dv, long long k0, long long k1, int G, long long Tq, long long Tk, float scale,
                          char* smem) {
  for (long long kb = k0; kb < k1; kb += BK) {
    if constexpr (D >= 128) {
      dkdv_block<D, CAUSAL, false, true, S>(go, glse, q, k, v, o, lse, dk, dv, kb, k1, G, Tq, Tk, scale, smem);
      dkdv_block<D, CAUSAL, true, false, S>(go, glse, q, k, v, o, lse, dk, dv, kb, k1, G, Tq, Tk, scale, smem);
    } else {
      dkdv_block<D, CAUSAL, true, true, S>(go, glse, q, k, v, o, lse, dk, dv, kb, k1, G, Tq, Tk, scale, smem);
    }
  }
}

}  // namespace amma
}  // namespace latch

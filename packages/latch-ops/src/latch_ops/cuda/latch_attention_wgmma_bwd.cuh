// latch::sdpa_backward on the worker (sm_90a): every operand block loaded by TMA into the kernel's
// ring of stages by the producer warp, the four products of a block on wgmma, P rebuilt from the
// saved lse. BF16 storage, head dims D = Dv in {64, 128}; the semantics of latch_ops/attention.py
// (causal = top-left aligned; lse natural-log; dterm = rowsum(dO * O) - glse).
//
// A task is latch_ops.attention.tiling_sdpa_backward's box: (batch, a group of query heads, rows
// [r0, r1)). It computes, in this order:
//   dQ  of its query rows, per query head and block of 64 rows: S = Q K^T, dP = dO V^T over the key
//       blocks the rows see, dS = P (dP - dterm), dQ += dS K (register A = dS);
//   dK, dV of its key rows (latch_ops.attention.key_block) per key/value head and block of 64 keys,
//       both in one pass over the (query head, query block) pairs of the group (heads in order,
//       blocks ascending; causal: from the key block's own): S^T = K Q^T, dP^T = V dO^T,
//       dV += P^T dO, dK += dS^T Q (register A = P^T, dS^T). Both FP32 accumulators stay in registers
//       for the whole pass; at D = 128 that leaves room beside them for S^T or dP^T and P^T's BF16
//       fragments, not for both FP32 products (BwdShape::SEQ: dS^T is computed from the BF16 P^T).
// Blocks are always 64 rows. The two consumer warpgroups split the loop of a block between them: the
// even key blocks (dQ) or (head, query block) pairs (dK/dV) go to warpgroup 0, the odd ones to
// warpgroup 1; at the end warpgroup 1 hands its FP32 partial sums to warpgroup 0 through shared memory
// and warpgroup 0 adds them (its own + the other's, a fixed order) and stores: no atomics, the same
// bits on every run. A warpgroup still waits for, and releases, the stages of the other's blocks.
//
// Stages (the producer's order is the consumers'):
//   query block (bh, qb): Q | dO | O | lse | glse for D = 64; for D = 128 Q | dO | lse | glse and a
//     second stage O (both halves need dO . O). Q, dO, O as D/64 3-D boxes of (64 columns, 64 rows,
//     1 head) of [B*H][T][D] (rows past T read as zeros), lse and glse as 1-D boxes of 68 floats of
//     the flat [B*H*Tq] tensors starting at bh * Tq + qb rounded down to 16 bytes (BwdShape::LSE_BOX;
//     rows past Tq read the next head's values: the body ignores them);
//   key block (bkv, kb): K | V, D/64 boxes each.
// The fixed operands of a block (Q and dO for dQ, K and V for dK/dV) are copied from their stage into
// the body's scratch and the stage is released at once, so no stage is held across the loop (a ring
// walked in order would deadlock). The row terms lse2 = lse log2 e and dterm = dO . O - glse of a
// query block are computed by the consumers from its stage (FP32, the O and dO bytes of a row in the
// same swizzled order: each row's sum has one fixed order).
//
// The CPU test (latch-ops tests/test_attention_wgmma_bwd_emulated.py) compiles this header against
// the model of attention_emulator/wgmma_model.h.
#pragma once

#include "latch_attention_wgmma.cuh"

namespace latch {
namespace awg {

template <int D> struct BwdShape {
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  static constexpr int B = 64;                   // rows of every block (queries or keys)
  static constexpr int DB = D / 64;              // 64-column (128-byte) boxes of a row
  static constexpr int TILE = B * D * 2;         // one [64][D] BF16 block: DB boxes of 8 KiB
  static constexpr bool SPLIT = D == 128;        // O of a query block in a second stage
  static constexpr int O_OFF = SPLIT ? 0 : 2 * TILE;  // in the query block's last stage
  // lse and glse of a query block: a 1-D box of LSE_BOX floats from the block's first row rounded
  // down to a multiple of 4 floats (the H200 faults, "illegal instruction", on a 1-D box whose start
  // is not 16-byte aligned: results/lead13.md), so the block's rows start lse_shift() floats in
  static constexpr int LSE_BOX = B + 4, LSE_BYTES = 4 * LSE_BOX, LSE_ROOM = (LSE_BYTES + 127) / 128 * 128;
  static constexpr int LSE_OFF = SPLIT ? 2 * TILE : 3 * TILE, GLSE_OFF = LSE_OFF + LSE_ROOM;  // in its first
  static constexpr int STAGE = GLSE_OFF + LSE_ROOM;   // bytes of a stage the body needs
  static constexpr int QSTAGES = SPLIT ? 2 : 1;  // stages of a query block (O in its own at D = 128)
  static constexpr int RT_OFF = 2 * TILE;        // scratch: two blocks, then the row terms
  static constexpr int SCRATCH = RT_OFF + 2 * 2 * 2 * 64 * 4;  // [wg][buffer][lse2, dterm][64]
  static_assert(2 * TILE <= STAGE, "a key block (K, V) fits one stage");
  static_assert(LSE_BYTES % 16 == 0, "a 1-D box is whole 16-byte chunks");
  static_assert(B * D * 4 <= 2 * TILE, "a warpgroup's FP32 partial block fits the two scratch blocks");
  // The products of a dK/dV pair. The loop holds both FP32 accumulators (2 x D/2 registers a thread)
  // beside S^T and dP^T (32 each). D = 64: S^T and dP^T are issued together, P^T and dS^T computed
  // from them in FP32. D = 128 (SEQ): 128 + 64 leave too few of the consumers' 224 registers for the
  // rest of the loop (ptxas put 68 local loads/stores in it, with bwd_ss_first), so S^T is issued
  // alone, P^T packed into the BF16 fragments of the dV product (32 -> 16 registers) before dP^T's
  // accumulators exist (they take S^T's registers), dP^T issued with dV += P^T dO, and dS^T computed
  // from those BF16 fragments (bwd_dkdv_ds; peak 128 + 32 + 16): 4 products a pair, P^T rounded once
  // more in dS^T (the FP64 gate's dk error 2.4e-3 -> 2.9e-3 on the CPU model).
  static constexpr bool SEQ = D == 128;
};

// The body's variants (``attention_body`` "wgmma" = 1, "wgmma2" = 2). Both compute the same sums in
// the same order (the same bits); 2 overlaps a warpgroup's elementwise work with its own products:
// S and dP are committed as two groups, P = exp2(S - lse) is computed while dP is still on the
// tensor cores (wgmma_wait<1>), and in the D = 64 dK/dV loop dV += P^T dO is issued before
// dS^T = P^T (dP^T - dterm) is computed (it runs under that work). Variant 1 waits for both products
// and runs the elementwise work between them with the tensor cores idle (the other warpgroup's work
// may fill them). The D = 128 dK/dV loop (BwdShape::SEQ) is the same in both: its products run one
// after another by construction.
constexpr int BWD_VARIANTS = 2;

#ifndef LATCH_EMULATED_WGMMA
// One 1-D box (no swizzle) of tensor map ``map`` at element ``c0`` into shared memory at ``dst``.
__device__ __forceinline__ void tma_load_1d(void* dst, const void* map, uint64_t* bar, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3}], [%2];"
               ::"r"(sm90::smem_addr(dst)), "l"(map), "r"(sm90::smem_addr(bar)), "r"(c0)
               : "memory");
}
__device__ __forceinline__ float ld_shared_f32(uint32_t a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t a) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_f32(uint32_t a, float v) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(a), "f"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ float2 bf2_to_f2(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
#endif

// The 1-D box of the row terms of query rows from flat row ``f`` = bh * Tq + qb starts at element
// lse_box_start(f) (16-byte aligned); the block's first row is lse_shift(f) floats into it.
__device__ __forceinline__ int lse_box_start(int f) { return f & ~3; }
__device__ __forceinline__ int lse_shift(int f) { return f & 3; }

// What both roles walk: the keys whose dK/dV a task of query rows [r0, r1) computes
// (latch_ops.attention.key_block) and the keys a query block [r, re) sees.
__device__ __forceinline__ void bwd_key_block(int r0, int r1, int Tq, int Tk, int& k0, int& k1) {
  k0 = r0 < Tk ? r0 : Tk;
  k1 = r1 >= Tq ? Tk : (r1 < Tk ? r1 : Tk);
}
template <bool CAUSAL> __device__ __forceinline__ int bwd_dq_key_end(int re, int Tk) { return CAUSAL ? (re < Tk ? re : Tk) : Tk; }
template <bool CAUSAL> __device__ __forceinline__ int bwd_q_start(int kb) { return CAUSAL ? kb : 0; }

// ---- producer (one thread) ----------------------------------------------------------------------
struct BwdMaps {
  const void *q, *k, *v, *go, *o, *lse, *glse;  // glse may be null (no gradient of lse)
};

// A query block's stage(s) (BwdShape::QSTAGES).
template <int D>
__device__ __forceinline__ bool bwd_load_query_block(Pipe& p, const BwdMaps& m, int bh, int qb, int Tq) {
  typedef BwdShape<D> S;
  const bool o_here = !S::SPLIT;  // O in the first stage
  {
    if (!pipe_wait(&p.empty[p.stage], p.phase ^ 1u, p)) return false;
    char* st = p.at(p.stage);
    uint64_t* full = &p.full[p.stage];
    sm90::mbar_arrive_expect_tx(full, (o_here ? 3 : 2) * S::TILE + S::LSE_BYTES * (m.glse ? 2 : 1));
#pragma unroll
    for (int j = 0; j < S::DB; ++j) {
      tma_load_3d(st + j * 8192, m.q, full, 64 * j, qb, bh);
      tma_load_3d(st + S::TILE + j * 8192, m.go, full, 64 * j, qb, bh);
      if (o_here) tma_load_3d(st + S::O_OFF + j * 8192, m.o, full, 64 * j, qb, bh);
    }
    tma_load_1d(st + S::LSE_OFF, m.lse, full, lse_box_start(bh * Tq + qb));
    if (m.glse) tma_load_1d(st + S::GLSE_OFF, m.glse, full, lse_box_start(bh * Tq + qb));
    p.advance();
  }
  if (S::QSTAGES == 2) {
    if (!pipe_wait(&p.empty[p.stage], p.phase ^ 1u, p)) return false;
    char* st = p.at(p.stage);
    uint64_t* full = &p.full[p.stage];
    sm90::mbar_arrive_expect_tx(full, S::TILE);
#pragma unroll
    for (int j = 0; j < S::DB; ++j) tma_load_3d(st + S::O_OFF + j * 8192, m.o, full, 64 * j, qb, bh);
    p.advance();
  }
  return true;
}

template <int D>
__device__ __forceinline__ bool bwd_load_key_block(Pipe& p, const BwdMaps& m, int bkv, int kb) {
  typedef BwdShape<D> S;
  if (!pipe_wait(&p.empty[p.stage], p.phase ^ 1u, p)) return false;
  char* st = p.at(p.stage);
  uint64_t* full = &p.full[p.stage];
  sm90::mbar_arrive_expect_tx(full, 2 * S::TILE);
#pragma unroll
  for (int j = 0; j < S::DB; ++j) {
    tma_load_3d(st + j * 8192, m.k, full, 64 * j, kb, bkv);
    tma_load_3d(st + S::TILE + j * 8192, m.v, full, 64 * j, kb, bkv);
  }
  p.advance();
  return true;
}

template <int D, bool CAUSAL, int V = 1>
__device__ __forceinline__ bool bwd_produce(Pipe& p, const Task* t, const BwdMaps& m, int H, int Hkv, int Tq, int Tk) {
  typedef BwdShape<D> S;
  const int G = H / Hkv, r0 = t->lo[2], r1 = t->hi[2];
  int k0, k1;
  bwd_key_block(r0, r1, Tq, Tk, k0, k1);
  for (int b = t->lo[0]; b < t->hi[0]; ++b) {
    for (int h = t->lo[1]; h < t->hi[1]; ++h)
      for (int r = r0; r < r1; r += S::B) {
        const int re = r + S::B < r1 ? r + S::B : r1, bkv = b * Hkv + h / G;
        if (!bwd_load_query_block<D>(p, m, b * H + h, r, Tq)) return false;
        const int kend = bwd_dq_key_end<CAUSAL>(re, Tk);
        for (int kb = 0; kb < kend; kb += S::B)
          if (!bwd_load_key_block<D>(p, m, bkv, kb)) return false;
      }
    for (int g = t->lo[1] / G; g < (t->hi[1] + G - 1) / G; ++g)
      for (int kb = k0; kb < k1; kb += S::B) {
        if (!bwd_load_key_block<D>(p, m, b * Hkv + g, kb)) return false;
        for (int hh = 0; hh < G; ++hh)
          for (int qb = bwd_q_start<CAUSAL>(kb); qb < Tq; qb += S::B)
            if (!bwd_load_query_block<D>(p, m, b * H + g * G + hh, qb, Tq)) return false;
      }
  }
  return true;
}

// ---- consumers ----------------------------------------------------------------------------------
// Both warpgroups wait for the stage, copy its first 2 TILE bytes into the scratch (the same bytes:
// the same swizzle), release it; false (for every consumer thread) if a wait failed.
template <int D>
__device__ __forceinline__ bool bwd_copy_block(Pipe& p, char* smem) {
  typedef BwdShape<D> S;
  const int tid = threadIdx.x;
  const bool ok = pipe_wait_warp(&p.full[p.stage], p.phase, p);
  if (ok) {
    const uint32_t src = sm90::smem_addr(p.at(p.stage)), dst = sm90::smem_addr(smem);
#pragma unroll
    for (int i = 0; i < 2 * S::TILE / (16 * 256); ++i) copy16_shared(dst + 4096 * i + 16 * tid, src + 4096 * i + 16 * tid);
    __syncwarp();
    if ((tid & 31) == 0) sm90::mbar_arrive(&p.empty[p.stage]);
    p.advance();
    sm90::fence_proxy_async_shared();  // the products read the copy through the async proxy
  }
  return !sm90::named_sync_or(1, 256, !ok);
}

// A warpgroup's row terms of query block [qb, qb + 64) from its first stage ``st0`` and last ``st1``
// into ``rt`` (shared-memory address: lse2[64] then dterm[64]; dterm only WITH_O); rows past Tq get 0
// (they are masked). Two threads per row; thread 2 i + half reads half of the row's bytes of O and dO.
template <int D, bool WITH_O>
__device__ __forceinline__ void bwd_row_terms(uint32_t rt, const char* st0, const char* st1, int bh, int qb, int Tq,
                                              bool glse) {
  typedef BwdShape<D> S;
  const int l = threadIdx.x & 127, row = l >> 1, half = l & 1;
  const uint32_t o = sm90::smem_addr(st1 + S::O_OFF), g = sm90::smem_addr(st0 + S::TILE);
  float d = 0.f;
  if (WITH_O) {
    // D = 64: the row's 128 bytes are one box row, halves of 64 bytes; D = 128: box ``half``'s row.
    // (The 128-byte swizzle permutes the 16-byte chunks within a row, the same for O and dO.)
#pragma unroll
    for (int c = 0; c < 4 * S::DB; ++c) {
      const uint32_t off = S::DB == 1 ? 128 * row + 64 * half + 16 * c : 8192 * half + 128 * row + 16 * c;
      const uint4 a = ld_shared_v4(o + off), b = ld_shared_v4(g + off);
      const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 x = bf2_to_f2(av[e]), y = bf2_to_f2(bv[e]);
        d += x.x * y.x;
        d += x.y * y.y;
      }
    }
    d += __shfl_xor_sync(0xffffffffu, d, 1);
  }
  if (half == 0) {
    const bool in = qb + row < Tq;
    const int at = 4 * (lse_shift(bh * Tq + qb) + row);  // (the box starts 16-byte aligned)
    const float lse = ld_shared_f32(sm90::smem_addr(st0 + S::LSE_OFF) + at);
    st_shared_f32(rt + 4 * row, in ? lse * LOG2E : 0.f);
    if (WITH_O) {
      const float gl = glse ? ld_shared_f32(sm90::smem_addr(st0 + S::GLSE_OFF) + at) : 0.f;
      st_shared_f32(rt + 256 + 4 * row, in ? d - gl : 0.f);
    }
  }
}

// Warpgroup 1's FP32 accumulators to warpgroup 0 (which adds them to its own: a fixed order). The
// scratch must be free (every product done: a block barrier before this).
template <int N> __device__ __forceinline__ void bwd_combine(float (&acc)[N], char* smem) {
  const int tid = threadIdx.x, l = tid & 127;
  const uint32_t part = sm90::smem_addr(smem);
  if (tid >= 128) {
#pragma unroll
    for (int i = 0; i < N; ++i) st_shared_f32(part + 4 * (128 * i + l), acc[i]);
  }
  sm90::named_sync(1, 256);
  if (tid < 128) {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] += ld_shared_f32(part + 4 * (128 * i + l));
  }
  sm90::named_sync(1, 256);
}

// A warpgroup's rows [row0, row0 + 64) of a [.][D] BF16 tensor from its accumulators times ``mul``,
// rows < rend only.
template <int D>
__device__ __forceinline__ void bwd_store(__nv_bfloat16* dst, const float (&acc)[D / 2], float mul, int row0, int rend) {
  const int l = threadIdx.x & 127, warp = l >> 5, lane = l & 31, g = lane >> 2, t4 = lane & 3;
  const int ra = row0 + 16 * warp + g, rb = ra + 8;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    const int col = 8 * j + 2 * t4;
    if (ra < rend) *reinterpret_cast<uint32_t*>(dst + (long long)ra * D + col) = pack_bf16(acc[4 * j] * mul, acc[4 * j + 1] * mul);
    if (rb < rend) *reinterpret_cast<uint32_t*>(dst + (long long)rb * D + col) = pack_bf16(acc[4 * j + 2] * mul, acc[4 * j + 3] * mul);
  }
}

// FP32 accumulators (m64 n64) -> the BF16 A fragments of a product over those 64 columns.
__device__ __forceinline__ void bwd_pack(uint32_t (&f)[4][4], const float (&s)[32]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) f[kk][e] = pack_bf16(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
}

// dS = P (dP - dterm) of a dQ block into ``s`` (P = 2^(S c2 - lse2); this thread's query rows a and
// b, key columns from ``kb``). MASK: the block holds keys past Tk or (causal) above the diagonal;
// blocks without (most of them) run no per-element test.
template <bool MASK, bool CAUSAL>
__device__ __forceinline__ void bwd_dq_ds(float (&s)[32], const float (&dp)[32], float c2, float l2a, float l2b,
                                          float dta, float dtb, int kb, int row_a, int row_b, int t4, int Tk) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float v = ex2(s[4 * j + e] * c2 - (e < 2 ? l2a : l2b)) * (dp[4 * j + e] - (e < 2 ? dta : dtb));
      if (MASK) {
        const int col = kb + 8 * j + 2 * t4 + (e & 1), row = e < 2 ? row_a : row_b;
        s[4 * j + e] = col < Tk && (!CAUSAL || col <= row) ? v : 0.f;
      } else {
        s[4 * j + e] = v;
      }
    }
}

// P^T into ``s`` and (DS) dS^T = P^T (dP^T - dterm) into ``dp`` of a dK/dV pair: this thread's key
// rows a and b, query columns from ``qb`` with their row terms at ``rt`` (lse2[64], dterm[64]).
// MASK as in bwd_dq_ds (queries past Tq, keys past Tk, causal: keys above the diagonal). ``dp`` is
// not read or written without DS (the caller may pass ``s``).
template <bool MASK, bool CAUSAL, bool DS>
__device__ __forceinline__ void bwd_dkdv_p(float (&s)[32], float (&dp)[32], uint32_t rt, float c2, int qb, int key_a,
                                           int key_b, int t4, int Tq, int Tk) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int lq = 8 * j + 2 * t4;  // this thread's query columns lq, lq + 1 (rows: keys a, b)
    const float2 l2 = ld_shared_f32x2(rt + 4 * lq);
    const float2 dt = DS ? ld_shared_f32x2(rt + 256 + 4 * lq) : make_float2(0.f, 0.f);
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2)
#pragma unroll
      for (int hb = 0; hb < 2; ++hb) {
        const int e = 2 * hb + e2;
        float pr = ex2(s[4 * j + e] * c2 - (e2 ? l2.y : l2.x));
        float ds = DS ? pr * (dp[4 * j + e] - (e2 ? dt.y : dt.x)) : 0.f;
        if (MASK) {
          const int qi = qb + lq + e2, key = hb ? key_b : key_a;
          const bool vis = qi < Tq && key < Tk && (!CAUSAL || key <= qi);
          pr = vis ? pr : 0.f;
          ds = vis ? ds : 0.f;
        }
        s[4 * j + e] = pr;
        if (DS) dp[4 * j + e] = ds;  // dS^T
      }
  }
}

// dS^T = P^T (dP^T - dterm) of a dK/dV pair from P^T as the BF16 fragments ``fp`` of its dV product
// (bwd_pack's layout: fp[j / 2][2 (j % 2) + h] holds accumulator elements 4 j + 2 h and + 1: key row
// h, query columns 8 j + 2 t4 and + 1), straight into the fragments ``fd`` of the dK product. No
// mask: a masked P^T is 0 and dP^T - dterm is finite there (rows past Tq or Tk are zero-filled,
// their row terms 0), so its dS^T is 0 as well.
__device__ __forceinline__ void bwd_dkdv_ds(uint32_t (&fd)[4][4], const uint32_t (&fp)[4][4], const float (&dp)[32],
                                            uint32_t rt, int t4) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 dt = ld_shared_f32x2(rt + 256 + 4 * (8 * j + 2 * t4));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 4 * j + 2 * h, kk = j >> 1, e = 2 * (j & 1) + h;
      const float2 pr = bf2_to_f2(fp[kk][e]);
      fd[kk][e] = pack_bf16(pr.x * (dp[i] - dt.x), pr.y * (dp[i + 1] - dt.y));
    }
  }
}

// The first K step of an S-like product, scale-d 0, with the accumulators as outputs only. The
// generated wgmma (latch_wgmma.cuh) reads them ("+f"), which makes the previous pair's values of
// the array (P^T) live around the whole loop into the next pair's first step: ptxas then keeps
// S^T's and dP^T's registers apart and the D = 128 dK/dV loop does not fit (C7512, spills in the
// loop). Used at D = 128 only: at D = 64 everything fits either way, and this form moved ptxas's
// choices there (more stack outside the loops, a longer wgmma2 dK/dV loop).
__device__ __forceinline__ void bwd_ss_first(float (&d)[32], uint64_t a, uint64_t b) {
#ifdef LATCH_EMULATED_WGMMA
  WgmmaSs<64>::run(d, a, b, 0);
#else
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 0, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n\t}"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "l"(a), "l"(b));
#endif
}

// S-like product of two 64-row K-major blocks: d (m64 n64) = A B^T over D (issued, not committed).
template <int D> __device__ __forceinline__ void bwd_issue_ss(float (&d)[32], const char* a, const char* b) {
  const uint64_t da = desc_base(a, 16, 1024), db = desc_base(b, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t off = (kk >> 2) * 8192 + 32 * (kk & 3);
    if (kk == 0 && D == 128) bwd_ss_first(d, desc_at(da, off), desc_at(db, off));
    else WgmmaSs<64>::run(d, desc_at(da, off), desc_at(db, off), kk == 0 ? 0 : 1);
  }
}

// acc (m64 nD) += F B over the block's 64 rows: F register fragments, B a [64][D] block (N-major).
template <int D> __device__ __forceinline__ void bwd_issue_rs(float (&acc)[D / 2], const uint32_t (&f)[4][4], const char* b) {
  const uint64_t db = desc_base(b, 8192, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) WgmmaRs<D>::template run<1>(acc, f[kk], desc_at(db, 2048 * kk), 1);
}

// dQ of rows [r, re) of query head bh (stages: its query block, then its key blocks).
template <int D, bool CAUSAL, int V>
__device__ __forceinline__ bool bwd_dq_block(Pipe& p, __nv_bfloat16* dq, int bh, int r, int re, int Tq, int Tk,
                                             float scale, bool glse, char* smem) {
  typedef BwdShape<D> S;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const float c2 = scale * LOG2E;
  const uint32_t rt = sm90::smem_addr(smem + S::RT_OFF) + 1024 * wg;
  // the query block: Q | dO copied into the scratch; each warpgroup its own row terms
  sm90::named_sync(1, 256);  // the scratch's previous readers are done
  uint32_t first = p.stage;
  bool ok = pipe_wait_warp(&p.full[p.stage], p.phase, p);
  if (ok) {
    const uint32_t src = sm90::smem_addr(p.at(p.stage)), dst = sm90::smem_addr(smem);
#pragma unroll
    for (int i = 0; i < 2 * S::TILE / (16 * 256); ++i) copy16_shared(dst + 4096 * i + 16 * tid, src + 4096 * i + 16 * tid);
    if (S::SPLIT) {
      p.advance();
      ok = pipe_wait_warp(&p.full[p.stage], p.phase, p);
    }
    if (ok) bwd_row_terms<D, true>(rt, p.at(first), p.at(p.stage), bh, r, Tq, glse);
    __syncwarp();
    if (ok && lane == 0) {
      sm90::mbar_arrive(&p.empty[first]);
      if (S::SPLIT) sm90::mbar_arrive(&p.empty[p.stage]);
    }
    p.advance();
    sm90::fence_proxy_async_shared();
  }
  if (sm90::named_sync_or(1, 256, !ok)) return false;
  const int la = 16 * warp + g, lb = la + 8;
  const int row_a = r + la, row_b = r + lb;
  const float l2a = ld_shared_f32(rt + 4 * la), l2b = ld_shared_f32(rt + 4 * lb);
  const float dta = ld_shared_f32(rt + 256 + 4 * la), dtb = ld_shared_f32(rt + 256 + 4 * lb);
  float acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
  const int kend = bwd_dq_key_end<CAUSAL>(re, Tk), nkb = (kend + S::B - 1) / S::B;
  bool fail = false;
#pragma unroll 1
  for (int n = 0; n < nkb; ++n) {
    if (!pipe_wait_warp(&p.full[p.stage], p.phase, p)) {
      fail = true;
      break;
    }
    if ((n & 1) == wg) {
      const char* st = p.at(p.stage);
      float s[32], dp[32];  // (written whole by their first product: scale-d 0)
      fence_regs(acc);
      sm90::wgmma_fence();
      const int kb = n * S::B;
      const bool edge = kb + S::B > Tk || (CAUSAL && kb + S::B - 1 > r);
      if (V == 1) {
        bwd_issue_ss<D>(s, smem, st);                // S = Q K^T
        bwd_issue_ss<D>(dp, smem + S::TILE, st + S::TILE);  // dP = dO V^T
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        fence_regs(s);
        fence_regs(dp);
        if (edge) bwd_dq_ds<true, CAUSAL>(s, dp, c2, l2a, l2b, dta, dtb, kb, row_a, row_b, t4, Tk);  // dS
        else bwd_dq_ds<false, CAUSAL>(s, dp, c2, l2a, l2b, dta, dtb, kb, row_a, row_b, t4, Tk);
      } else {
        bwd_issue_ss<D>(s, smem, st);  // S = Q K^T
        sm90::wgmma_commit();
        bwd_issue_ss<D>(dp, smem + S::TILE, st + S::TILE);  // dP = dO V^T
        sm90::wgmma_commit();
        sm90::wgmma_wait<1>();  // S landed; dP may still run
        fence_regs(s);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = kb + 8 * j + 2 * t4 + (e & 1);
            const int row = e < 2 ? row_a : row_b;
            const bool vis = !edge || (col < Tk && (!CAUSAL || col <= row));
            s[4 * j + e] = vis ? ex2(s[4 * j + e] * c2 - (e < 2 ? l2a : l2b)) : 0.f;  // P
          }
        sm90::wgmma_wait<0>();
        fence_regs(dp);
        fence_regs(s);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - (e < 2 ? dta : dtb));  // dS
      }
      uint32_t f[4][4];
      bwd_pack(f, s);
      sm90::wgmma_fence();
      bwd_issue_rs<D>(acc, f, st);  // dQ += dS K
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      fence_regs(acc);
      fence_frags(f);
    }
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(&p.empty[p.stage]);
    p.advance();
  }
  if (sm90::named_sync_or(1, 256, fail)) return false;
  bwd_combine(acc, smem);
  if (wg == 0) bwd_store<D>(dq + (long long)bh * Tq * D, acc, scale, r, re < Tq ? re : Tq);
  return true;
}

// dK and dV of keys [kb, kend) of key/value head bkv, summed over its G query heads and their query
// blocks in one pass (stages: the key block, then the query blocks in the producer's order; the
// products of a pair as BwdShape::SEQ says).
template <int D, bool CAUSAL, int V>
__device__ __forceinline__ bool bwd_dkdv_block(Pipe& p, __nv_bfloat16* dk, __nv_bfloat16* dv, int bkv, int G,
                                               int kb, int kend, int Tq, int Tk, float scale, bool glse, char* smem) {
  typedef BwdShape<D> S;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const float c2 = scale * LOG2E;
  sm90::named_sync(1, 256);  // the scratch's previous readers are done
  if (!bwd_copy_block<D>(p, smem)) return false;  // K | V
  float ak[D / 2], av[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) ak[i] = av[i] = 0.f;
  const int key_a = kb + 16 * warp + g, key_b = key_a + 8;
  const int qstart = bwd_q_start<CAUSAL>(kb);
  const int nq = qstart < Tq ? (Tq - qstart + S::B - 1) / S::B : 0, total = G * nq;
  bool fail = false;
#pragma unroll 1
  for (int pi = 0; pi < total; ++pi) {
    constexpr bool TWO = S::QSTAGES == 2;
    const uint32_t sa = p.stage;
    bool ok = pipe_wait_warp(&p.full[p.stage], p.phase, p);
    if (TWO) {
      p.advance();
      ok = ok && pipe_wait_warp(&p.full[p.stage], p.phase, p);
    }
    const uint32_t sb = p.stage;  // the block's last stage
    if ((pi & 1) == wg) {
      const int qb = qstart + (pi % nq) * S::B;
      const char* st = p.at(sa);
      const uint32_t rt = sm90::smem_addr(smem + S::RT_OFF) + 1024 * wg + 512 * ((pi >> 1) & 1);
      if (sm90::named_sync_or(2 + wg, 128, !ok)) {  // a failed wait, voted on: no warp is left at a barrier
        fail = true;
        break;
      }
      const bool edge = qb + S::B > Tq || kb + S::B > Tk || (CAUSAL && qb < kb + S::B - 1);
      fence_regs(ak);
      fence_regs(av);
      if (S::SEQ) {
        // S^T alone; P^T -> BF16 fragments; dP^T and dV += P^T dO; dS^T from the fragments; dK
        float s[32];  // (written whole by its first product: scale-d 0)
        sm90::wgmma_fence();
        bwd_issue_ss<D>(s, smem, st);  // S^T = K Q^T
        sm90::wgmma_commit();
        bwd_row_terms<D, true>(rt, st, p.at(sb), bkv * G + pi / nq, qb, Tq, glse);  // query head b H + g G + hh
        sm90::named_sync(2 + wg, 128);  // the warpgroup's row terms are written
        sm90::wgmma_wait<0>();
        fence_regs(s);
        if (edge) bwd_dkdv_p<true, CAUSAL, false>(s, s, rt, c2, qb, key_a, key_b, t4, Tq, Tk);
        else bwd_dkdv_p<false, CAUSAL, false>(s, s, rt, c2, qb, key_a, key_b, t4, Tq, Tk);
        uint32_t fp[4][4];
        bwd_pack(fp, s);  // (s is dead from here: dP^T may take its registers)
        float dp[32];
        sm90::wgmma_fence();
        bwd_issue_ss<D>(dp, smem + S::TILE, st + S::TILE);  // dP^T = V dO^T
        bwd_issue_rs<D>(av, fp, st + S::TILE);             // dV += P^T dO
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        fence_regs(dp);
        fence_regs(av);
        fence_frags(fp);
        uint32_t fd[4][4];
        bwd_dkdv_ds(fd, fp, dp, rt, t4);  // dS^T
        sm90::wgmma_fence();
        bwd_issue_rs<D>(ak, fd, st);  // dK += dS^T Q
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        fence_regs(ak);
        fence_frags(fd);
      } else {
        float s[32], dp[32];  // (written whole by their first product: scale-d 0)
        sm90::wgmma_fence();
        bwd_issue_ss<D>(s, smem, st);  // S^T = K Q^T
        if (V == 2) sm90::wgmma_commit();  // S^T its own group
        bwd_issue_ss<D>(dp, smem + S::TILE, st + S::TILE);  // dP^T = V dO^T
        sm90::wgmma_commit();
        bwd_row_terms<D, true>(rt, st, p.at(sb), bkv * G + pi / nq, qb, Tq, glse);  // query head b H + g G + hh
        sm90::named_sync(2 + wg, 128);  // the warpgroup's row terms are written
        uint32_t fp[4][4], fd[4][4];
        if (V == 2) {
          // S^T landed (dP^T may still run): P^T, then dV += P^T dO issued, then dS^T under it
          sm90::wgmma_wait<1>();
          fence_regs(s);
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
              const int lq = 8 * j + 2 * t4 + e2, qi = qb + lq;
              const float l2 = ld_shared_f32(rt + 4 * lq);
#pragma unroll
              for (int hb = 0; hb < 2; ++hb) {
                const int e = 2 * hb + e2, key = hb ? key_b : key_a;
                const bool vis = !edge || (qi < Tq && key < Tk && (!CAUSAL || key <= qi));
                s[4 * j + e] = vis ? ex2(s[4 * j + e] * c2 - l2) : 0.f;
              }
            }
          bwd_pack(fp, s);
          sm90::wgmma_fence();
          bwd_issue_rs<D>(av, fp, st + S::TILE);  // dV += P^T dO
          sm90::wgmma_commit();
          sm90::wgmma_wait<1>();  // dP^T landed; dV may still run
          fence_regs(dp);
          fence_regs(s);
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
              const float dt = ld_shared_f32(rt + 256 + 4 * (8 * j + 2 * t4 + e2));
#pragma unroll
              for (int hb = 0; hb < 2; ++hb) dp[4 * j + 2 * hb + e2] = s[4 * j + 2 * hb + e2] * (dp[4 * j + 2 * hb + e2] - dt);
            }
          bwd_pack(fd, dp);
          sm90::wgmma_fence();
          bwd_issue_rs<D>(ak, fd, st);  // dK += dS^T Q
        } else {
          sm90::wgmma_wait<0>();
          fence_regs(s);
          fence_regs(dp);
          if (edge) bwd_dkdv_p<true, CAUSAL, true>(s, dp, rt, c2, qb, key_a, key_b, t4, Tq, Tk);
          else bwd_dkdv_p<false, CAUSAL, true>(s, dp, rt, c2, qb, key_a, key_b, t4, Tq, Tk);
          bwd_pack(fp, s);
          bwd_pack(fd, dp);
          sm90::wgmma_fence();
          bwd_issue_rs<D>(av, fp, st + S::TILE);  // dV += P^T dO
          bwd_issue_rs<D>(ak, fd, st);            // dK += dS^T Q
        }
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        fence_regs(ak);
        fence_frags(fd);
        fence_regs(av);
        fence_frags(fp);
      }
    } else if (sm90::named_sync_or(2 + wg, 128, !ok)) {  // the other warpgroup's block: vote the waits
      fail = true;
      break;
    }
    __syncwarp();
    if (lane == 0) {
      sm90::mbar_arrive(&p.empty[sa]);
      if (TWO) sm90::mbar_arrive(&p.empty[sb]);
    }
    p.advance();
  }
  if (sm90::named_sync_or(1, 256, fail)) return false;
  const int rend = kend < Tk ? kend : Tk;
  bwd_combine(av, smem);
  if (wg == 0) bwd_store<D>(dv + (long long)bkv * Tk * D, av, 1.f, kb, rend);
  bwd_combine(ak, smem);
  if (wg == 0) bwd_store<D>(dk + (long long)bkv * Tk * D, ak, scale, kb, rend);
  return true;
}

// Consumers (threads 0..255): the task's dQ blocks, then its dK/dV blocks. Pointers at the whole
// tensors ([B*H][Tq][D], [B*Hkv][Tk][D]); ``smem`` the body's scratch (BwdShape::SCRATCH bytes,
// 1024-byte aligned). False if the launch was aborted.
template <int D, bool CAUSAL, int V = 1>
__device__ __forceinline__ bool bwd_consume(Pipe& p, const Task* t, __nv_bfloat16* dq, __nv_bfloat16* dk,
                                            __nv_bfloat16* dv, bool glse, int H, int Hkv, int Tq, int Tk, float scale,
                                            char* smem) {
  typedef BwdShape<D> S;
  const int G = H / Hkv, r0 = t->lo[2], r1 = t->hi[2];
  int k0, k1;
  bwd_key_block(r0, r1, Tq, Tk, k0, k1);
  for (int b = t->lo[0]; b < t->hi[0]; ++b) {
    for (int h = t->lo[1]; h < t->hi[1]; ++h)
      for (int r = r0; r < r1; r += S::B) {
        const int re = r + S::B < r1 ? r + S::B : r1;
        if (!bwd_dq_block<D, CAUSAL, V>(p, dq, b * H + h, r, re, Tq, Tk, scale, glse, smem)) return false;
      }
    for (int g = t->lo[1] / G; g < (t->hi[1] + G - 1) / G; ++g)
      for (int kb = k0; kb < k1; kb += S::B) {
        const int ke = kb + S::B < k1 ? kb + S::B : k1;
        if (!bwd_dkdv_block<D, CAUSAL, V>(p, dk, dv, b * Hkv + g, G, kb, ke, Tq, Tk, scale, glse, smem))
          return false;
      }
  }
  return true;
}

}  // namespace awg
}  // namespace latch

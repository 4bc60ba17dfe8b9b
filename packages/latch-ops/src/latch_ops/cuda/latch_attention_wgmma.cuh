// latch::sdpa forward on the worker (sm_90a): Q, K and V loaded by TMA into the kernel's ring of
// shared-memory stages by the producer warp, S = Q K^T and O += P V on wgmma, the online softmax
// in registers. BF16 storage, head dims D = Dv in {64, 128}; the semantics of
// latch_ops/attention.py (causal = top-left aligned: key j > query i is masked; lse in natural log).
//
// A task is a box of (batch, head, query rows); it is walked in tiles of BM = 128 query rows of one
// (b, h). Per tile the producer fills, in order:
//   1 stage:  Q, the tile's 128 rows, as D/64 blocks of [128 rows][64 columns] (16 KiB each);
//   n stages: K and V of BN = 64 keys each (16 KiB a stage for D = 64, 32 KiB for D = 128), K as
//             D/64 blocks of [BN][64] at offset 0, V the same at offset BN * D * 2.
// Every block is one 3-D TMA box (64 columns, rows, 1 head) of the tensor viewed as [B*H][T][D], so
// rows past T read as zeros (odd lengths) without touching the next head. All boxes are 128-byte
// swizzled (latch_sm90.cuh wgmma_desc). Causal tiles stop at the block holding their last query row.
//
// Consumer warpgroup w (of 2) owns query rows 64 w .. 64 w + 63 of the tile. It copies its Q rows
// from the first stage into its half of the body's scratch (the same bytes, so the same swizzle) and
// releases that stage at once, so the Q stage never blocks the ring. Per key block: S = Q K^T
// (m64 nBN k16 x D/16, A = the Q copy and B = K, both K-major in shared memory), masked (keys >= Tk;
// causal: keys above the diagonal) only on the blocks that need it, online softmax in the log2
// domain (exp2 of scores prescaled by scale * log2 e), P rounded to BF16 in registers and O += P V
// (m64 nD k16 x BN/16, register A = P, B = V N-major; head dim 64: into an accumulator of the
// block's own, added into O after its wait, see FwdOwnPv), then the stage goes back to the producer;
// consecutive blocks overlap (see fwd_consume). A causal block wholly above a warpgroup's rows is
// skipped by that warpgroup (still waited for and released). Named barriers 2 + w (128 threads)
// order a warpgroup's Q copy against its products.
// The 8 consumer warps each arrive once on a stage's ``empty`` barrier (latch_pipe.cuh).
//
// The CPU test (latch-ops tests/test_attention_wgmma_emulated.py) compiles this header with
// LATCH_EMULATED_WGMMA against its own model of the worker (attention_emulator/wgmma_model.h: the
// producer and 256 consumer fibers, mbarriers, TMA boxes with the 128-byte swizzle, register-A wgmma
// reading descriptors), so the guarded primitives below are the hardware's only.
#pragma once

#ifndef LATCH_EMULATED_WGMMA
#include "latch_common.cuh"
#include "latch_pipe.cuh"
#include "latch_sm90.cuh"
#include "latch_wgmma.cuh"
#endif

namespace latch {
namespace awg {

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

template <int D> struct FwdShape {
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  static constexpr int BM = 128;                // query rows per tile (two warpgroups of 64)
  // keys per stage: 64 for both head dims (D = 64 took 128 before: with the per-block P V
  // accumulator, FwdOwnPv, that left ptxas short of registers in TinyMoE-200M's kernel, C7512)
  static constexpr int BN = 64;
  static constexpr int DB = D / 64;              // 64-column (128-byte) blocks of a row
  static constexpr int Q_BYTES = BM * D * 2;
  static constexpr int KV_BYTES = BN * D * 2;    // K (or V) of one stage
  static constexpr int STAGE = 2 * KV_BYTES;
  static_assert(Q_BYTES <= STAGE, "Q fits one stage");
};

#ifndef LATCH_EMULATED_WGMMA
// One 3-D box of tensor map ``map`` at element coordinates (c0 innermost, c1, c2) into shared memory
// at ``dst`` (1024-byte aligned for 128-byte swizzling); completion counted in bytes on ``bar``.
// Elements outside the tensor read as zero.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
      ::"r"(sm90::smem_addr(dst)), "l"(map), "r"(sm90::smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

#endif

// 2^x on the MUFU unit alone (ex2.approx.ftz: results below 2^-126 are 0). exp2f adds a range
// check and a squaring around the same MUFU.EX2 for such tiny results (a probability below 1e-38
// adds nothing to a BF16 product); in the score loops that was 4 more instructions an element.
__device__ __forceinline__ float ex2(float x) {
#ifndef LATCH_EMULATED_WGMMA
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  const float y = std::exp2(x);
  return y < 1.17549435e-38f ? 0.f : y;
#endif
}

// Keys a tile of query rows [r0, r1) reads: all of them, or (causal) up to its last row.
template <bool CAUSAL> __device__ __forceinline__ int fwd_key_end(int r1, int Tk) {
  return CAUSAL ? (r1 < Tk ? r1 : Tk) : Tk;
}

// Producer (one thread): every stage of every tile of the task's box, in the consumers' order.
template <int D, bool CAUSAL>
__device__ __forceinline__ bool fwd_produce(Pipe& p, const Task* t, const void* map_q, const void* map_k,
                                            const void* map_v, int H, int Hkv, int Tq, int Tk) {
  typedef FwdShape<D> S;
  const int G = H / Hkv;
  for (int b = t->lo[0]; b < t->hi[0]; ++b)
    for (int h = t->lo[1]; h < t->hi[1]; ++h)
      for (int r0 = t->lo[2]; r0 < t->hi[2]; r0 += S::BM) {
        const int bh = b * H + h, bkv = b * Hkv + h / G;
        const int r1 = r0 + S::BM < t->hi[2] ? r0 + S::BM : t->hi[2];
        if (!pipe_wait(&p.empty[p.stage], p.phase ^ 1u, p)) return false;
        {
          char* st = p.at(p.stage);
          uint64_t* full = &p.full[p.stage];
          sm90::mbar_arrive_expect_tx(full, S::Q_BYTES);
#pragma unroll
          for (int j = 0; j < S::DB; ++j) tma_load_3d(st + j * (S::BM * 128), map_q, full, 64 * j, r0, bh);
          p.advance();
        }
        const int kend = fwd_key_end<CAUSAL>(r1, Tk);
        for (int kb = 0; kb < kend; kb += S::BN) {
          if (!pipe_wait(&p.empty[p.stage], p.phase ^ 1u, p)) return false;
          char* st = p.at(p.stage);
          uint64_t* full = &p.full[p.stage];
          sm90::mbar_arrive_expect_tx(full, S::STAGE);
#pragma unroll
          for (int j = 0; j < S::DB; ++j) {
            tma_load_3d(st + j * (S::BN * 128), map_k, full, 64 * j, kb, bkv);
            tma_load_3d(st + S::KV_BYTES + j * (S::BN * 128), map_v, full, 64 * j, kb, bkv);
          }
          p.advance();
        }
      }
  return true;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// A compiler barrier on accumulator registers: the wgmma asm statements look synchronous to the
// compiler, which could otherwise move ordinary reads or writes of them across the wgmma_wait that
// really completes them.
template <int N> __device__ __forceinline__ void fence_regs(float (&r)[N]) {
#ifndef LATCH_EMULATED_WGMMA
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
#endif
}

// The same on register-A fragments (read by a wgmma until it completes).
template <int N> __device__ __forceinline__ void fence_frags(uint32_t (&r)[N][4]) {
#ifndef LATCH_EMULATED_WGMMA
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
#endif
}

template <int N> struct WgmmaSs;
template <> struct WgmmaSs<64> {
  __device__ __forceinline__ static void run(float (&d)[32], uint64_t a, uint64_t b, int s) {
    sm90::wgmma_bf16_m64n64k16<0, 0>(d, a, b, s);
  }
};
template <> struct WgmmaSs<128> {
  __device__ __forceinline__ static void run(float (&d)[64], uint64_t a, uint64_t b, int s) {
    sm90::wgmma_bf16_m64n128k16<0, 0>(d, a, b, s);
  }
};

template <int N> struct WgmmaRs;
template <> struct WgmmaRs<64> {
  template <int TB> __device__ __forceinline__ static void run(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int s) {
    sm90::wgmma_bf16_m64n64k16_rs<TB>(d, a, b, s);
  }
};
template <> struct WgmmaRs<128> {
  template <int TB> __device__ __forceinline__ static void run(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int s) {
    sm90::wgmma_bf16_m64n128k16_rs<TB>(d, a, b, s);
  }
};

// One warpgroup's online-softmax state for its thread's two rows (a: row g, b: row g + 8 of the
// warp's 16): running maxima in the log2 domain and partial sums of this thread's columns.
struct RowState {
  float m_a, m_b, l_a, l_b;
};

// Scores ``s`` of key block [kb, kb + BN) (accumulator layout) -> probabilities (unnormalised,
// relative to the new running maxima), masking keys >= Tk and (causal) keys above the diagonal
// where the block holds any; returns the factors (al_a, al_b) the output rows must be rescaled by.
template <int BN, bool CAUSAL>
__device__ __forceinline__ float2 online_softmax(float (&s)[BN / 2], RowState& r, int kb, int Tk, int wrow0, int row_a,
                                                 int row_b, int t4, float c2) {
  if (kb + BN > Tk || (CAUSAL && kb + BN - 1 > wrow0)) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = kb + 8 * j + 2 * t4 + (e & 1);
        const int row = e < 2 ? row_a : row_b;
        const bool ok = col < Tk && (!CAUSAL || col <= row);
        s[4 * j + e] = ok ? s[4 * j + e] * c2 : -inf();
      }
  } else {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) s[i] *= c2;
  }
  float mx_a = -inf(), mx_b = -inf();
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    mx_a = fmaxf(mx_a, fmaxf(s[4 * j], s[4 * j + 1]));
    mx_b = fmaxf(mx_b, fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
  }
  const float nm_a = fmaxf(r.m_a, mx_a), nm_b = fmaxf(r.m_b, mx_b);
  // a row with no visible key yet keeps m = -inf: use 0 as its offset (every p is 0 then)
  const float u_a = nm_a == -inf() ? 0.f : nm_a, u_b = nm_b == -inf() ? 0.f : nm_b;
  const float al_a = ex2(r.m_a - u_a), al_b = ex2(r.m_b - u_b);
  r.m_a = nm_a;
  r.m_b = nm_b;
  float sa = 0.f, sb = 0.f;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    s[4 * j] = ex2(s[4 * j] - u_a);
    s[4 * j + 1] = ex2(s[4 * j + 1] - u_a);
    s[4 * j + 2] = ex2(s[4 * j + 2] - u_b);
    s[4 * j + 3] = ex2(s[4 * j + 3] - u_b);
    sa += s[4 * j] + s[4 * j + 1];
    sb += s[4 * j + 2] + s[4 * j + 3];
  }
  r.l_a = r.l_a * al_a + sa;
  r.l_b = r.l_b * al_b + sb;
  return make_float2(al_a, al_b);
}

// P (accumulator layout, FP32) -> the BF16 A fragments of P V's BN / 16 k-steps.
template <int BN> __device__ __forceinline__ void pack_p(uint32_t (&pf)[BN / 16][4], const float (&s)[BN / 2]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    pf[kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]);
    pf[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
    pf[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
    pf[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// A descriptor the compiler must recompute where it is used: loop-invariant descriptors hoisted out
// of the key loop would hold 2 registers each for the whole loop (ptxas spills them); offsets from
// one laundered base cost an integer add each.
__device__ __forceinline__ uint64_t desc_base(const void* smem, uint32_t lbo, uint32_t sbo) {
  uint64_t d = sm90::wgmma_desc(smem, lbo, sbo);
#ifndef LATCH_EMULATED_WGMMA
  asm volatile("" : "+l"(d));
#endif
  return d;
}
// The descriptor ``bytes`` further (the start address field counts 16-byte units; it does not carry
// into the next field: every address is below 256 KiB)
__device__ __forceinline__ uint64_t desc_at(uint64_t base, uint32_t bytes) { return base + (bytes >> 4); }

// S = Q K^T of the key block in stage ``st`` (issued, not committed); ``sq`` is the warpgroup's 64
// Q rows in the scratch copy (D/64 blocks of 128 rows, 16 KiB apart: K-major A as in latch_gemm.cuh).
template <int D, int BN>
__device__ __forceinline__ void issue_s(float (&s)[BN / 2], const char* sq, const char* st) {
  const uint64_t qa = desc_base(sq, 16, 1024), kb = desc_base(st, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t off = 32 * (kk & 3);
    WgmmaSs<BN>::run(s, desc_at(qa, (kk >> 2) * (128 * 128) + off), desc_at(kb, (kk >> 2) * (BN * 128) + off),
                     kk == 0 ? 0 : 1);
  }
}

// O += P V of the key block in stage ``st`` (issued, not committed).
// O += P V of the key block in stage ``st`` (issued, not committed); ``add`` 0: O = P V (the first
// k-step does not read O).
template <int D, int BN>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&pf)[BN / 16][4], const char* st, int add) {
  const uint64_t vb = desc_base(st + BN * D * 2, BN * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) WgmmaRs<D>::template run<1>(o, pf[kk], desc_at(vb, 2048 * kk), kk == 0 ? add : 1);
}

// Where a key block's P V accumulates (fwd_consume): D = 64 gives every block's P V an accumulator
// of its own (``pv``: written whole by the block's first k-step) that is added into O after its
// wait, so no wgmma accumulates into registers that live across the key loop. With O itself the
// accumulator, ptxas serialised every wgmma of a model's kernel (C7511, "insufficient register
// resources for the wgmma pipeline in the function 'latch_kernel'") once this forward, the wgmma
// backward and a 128 x 64 product were inlined together (results/sa.md: the bisection on the dense
// transformer's kernel); with its own accumulator it pipelines there, and with 64-key blocks
// (FwdShape::BN: S and P take 32 + 16 registers, not 64 + 32) in TinyMoE-200M's kernel too (128-key
// blocks: C7512, "insufficient register resources for the function"). D = 128 keeps O (64 more
// registers beside O's 64 would not fit).
template <int D> struct FwdOwnPv {
  static constexpr bool value = D == 64;
};

// 16 bytes shared -> shared through registers (ld/st.shared: generic addresses would cost the
// address translation on every access)
__device__ __forceinline__ void copy16_shared(uint32_t dst, uint32_t src) {
#ifndef LATCH_EMULATED_WGMMA
  uint32_t a, b, c, d;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(src) : "memory");
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
#else
  std::memcpy(emu::smem_base + dst, emu::smem_base + src, 16);
#endif
}

// Consumers (threads 0..255): every tile of the task's box. ``out`` and ``lse`` are the whole
// tensors ([B*H][Tq][D], [B*H][Tq]; lse may be null); ``smem`` the body's scratch (FwdShape::Q_BYTES,
// 1024-byte aligned: the Q tile). False if the launch was aborted.
//
// Per warpgroup the products of consecutive key blocks overlap the softmax (FlashAttention-3's
// intra-warpgroup pipelining): S(n) and then P V(n - 1) are issued back to back; the softmax of
// block n runs while P V(n - 1) is still on the tensor cores; only then is P V(n - 1) awaited, its
// stage released, O rescaled and P(n) packed. Blocks wholly above a causal warpgroup's rows are
// a suffix of the tile's blocks: they are waited for and released without work.
template <int D, bool CAUSAL>
__device__ __forceinline__ bool fwd_consume(Pipe& p, const Task* t, __nv_bfloat16* out, float* lse, int H, int Tq,
                                            int Tk, float scale, char* smem) {
  typedef FwdShape<D> S;
  constexpr int BN = S::BN, KP = BN / 16;
  constexpr bool OWN = FwdOwnPv<D>::value;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const float c2 = scale * LOG2E;
  for (int b = t->lo[0]; b < t->hi[0]; ++b)
    for (int h = t->lo[1]; h < t->hi[1]; ++h)
      for (int r0 = t->lo[2]; r0 < t->hi[2]; r0 += S::BM) {
        const int bh = b * H + h;
        const int r1 = r0 + S::BM < t->hi[2] ? r0 + S::BM : t->hi[2];
        const int wrow0 = r0 + 64 * wg;                              // the warpgroup's first query row
        const int row_a = wrow0 + 16 * warp + g, row_b = row_a + 8;  // this thread's two rows
        // Q: the warpgroup's 64 rows from the stage into its half of the scratch (the same bytes, so
        // the same swizzle), then the stage goes back to the producer at once: Q never pins the ring.
        // The warpgroup's barrier before the copy: its products of the previous tile read the old Q.
        // (A failed wait is voted on over the warpgroup, so that no warp is left at its barrier.)
        sm90::named_sync(2 + wg, 128);
        const bool q_ok = pipe_wait_warp(&p.full[p.stage], p.phase, p);
        if (q_ok) {
          const uint32_t src = sm90::smem_addr(p.at(p.stage)) + 8192 * wg + 16 * (tid & 127),
                         dst = sm90::smem_addr(smem) + 8192 * wg + 16 * (tid & 127);
#pragma unroll
          for (int j = 0; j < S::DB; ++j)
#pragma unroll
            for (int i = 0; i < 8192 / (16 * 128); ++i)
              copy16_shared(dst + j * (S::BM * 128) + 2048 * i, src + j * (S::BM * 128) + 2048 * i);
          __syncwarp();
          if (lane == 0) sm90::mbar_arrive(&p.empty[p.stage]);
          p.advance();
          sm90::fence_proxy_async_shared();  // the products read the copy through the async proxy
        }
        if (sm90::named_sync_or(2 + wg, 128, !q_ok)) return false;
        const char* sq = smem + 8192 * wg;
        const int kend = fwd_key_end<CAUSAL>(r1, Tk);
        const int nblocks = (kend + BN - 1) / BN;
        // causal: the blocks holding a key <= the warpgroup's last row
        const int wend = wrow0 + 64 < kend ? wrow0 + 64 : kend;
        const int nlive = CAUSAL ? (wend + BN - 1) / BN : nblocks;
        float o[D / 2];
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
        RowState rs{-inf(), -inf(), 0.f, 0.f};
        float s[BN / 2];
        float pv[D / 2];  // (dead where !OWN)
        float (&acc)[D / 2] = OWN ? pv : o;
        uint32_t pf[KP][4];
        uint32_t prev = 0;  // the stage of the block whose P V is pending
        if (nlive > 0) {
          if (!pipe_wait_warp(&p.full[p.stage], p.phase, p)) return false;
          sm90::wgmma_fence();
          issue_s<D, BN>(s, sq, p.at(p.stage));
          sm90::wgmma_commit();
          sm90::wgmma_wait<0>();
          fence_regs(s);
          online_softmax<BN, CAUSAL>(s, rs, 0, Tk, wrow0, row_a, row_b, t4, c2);  // (O is zero: no rescale)
          pack_p<BN>(pf, s);
          prev = p.stage;
          p.advance();
        }
#pragma unroll 1
        for (int n = 1; n < nlive; ++n) {
          if (!pipe_wait_warp(&p.full[p.stage], p.phase, p)) {
            sm90::wgmma_wait<0>();
            return false;
          }
          fence_regs(o);
          if (OWN) fence_regs(pv);
          fence_regs(s);
          sm90::wgmma_fence();
          issue_s<D, BN>(s, sq, p.at(p.stage));
          sm90::wgmma_commit();
          issue_pv<D, BN>(acc, pf, p.at(prev), OWN ? 0 : 1);
          sm90::wgmma_commit();
          sm90::wgmma_wait<1>();  // S(n) landed; P V(n - 1) may still run
          fence_regs(s);
          const float2 al = online_softmax<BN, CAUSAL>(s, rs, n * BN, Tk, wrow0, row_a, row_b, t4, c2);
          sm90::wgmma_wait<0>();
          fence_regs(acc);
          fence_frags(pf);
          if (OWN) {
#pragma unroll
            for (int i = 0; i < D / 2; ++i) o[i] += pv[i];
          }
          __syncwarp();
          if (lane == 0) sm90::mbar_arrive(&p.empty[prev]);
#pragma unroll
          for (int j = 0; j < D / 8; ++j) {
            o[4 * j] *= al.x;
            o[4 * j + 1] *= al.x;
            o[4 * j + 2] *= al.y;
            o[4 * j + 3] *= al.y;
          }
          pack_p<BN>(pf, s);
          prev = p.stage;
          p.advance();
        }
        if (nlive > 0) {
          fence_regs(o);
          if (OWN) fence_regs(pv);
          sm90::wgmma_fence();
          issue_pv<D, BN>(acc, pf, p.at(prev), OWN ? 0 : 1);
          sm90::wgmma_commit();
          sm90::wgmma_wait<0>();
          fence_regs(acc);
          fence_frags(pf);
          if (OWN) {
#pragma unroll
            for (int i = 0; i < D / 2; ++i) o[i] += pv[i];
          }
          __syncwarp();
          if (lane == 0) sm90::mbar_arrive(&p.empty[prev]);
        }
        for (int n = nlive; n < nblocks; ++n) {  // causal blocks above this warpgroup's rows
          if (!pipe_wait_warp(&p.full[p.stage], p.phase, p)) return false;
          __syncwarp();
          if (lane == 0) sm90::mbar_arrive(&p.empty[p.stage]);
          p.advance();
        }
        float l_a = rs.l_a, l_b = rs.l_b;
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
          l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
          l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
        }
        const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
        const bool st_a = row_a < r1 && row_a < Tq, st_b = row_b < r1 && row_b < Tq;
        __nv_bfloat16* ob = out + (long long)bh * Tq * D;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          const int col = 8 * j + 2 * t4;
          if (st_a)
            *reinterpret_cast<uint32_t*>(ob + (long long)row_a * D + col) = pack_bf16(o[4 * j] * inv_a, o[4 * j + 1] * inv_a);
          if (st_b)
            *reinterpret_cast<uint32_t*>(ob + (long long)row_b * D + col) = pack_bf16(o[4 * j + 2] * inv_b, o[4 * j + 3] * inv_b);
        }
        if (lse && t4 == 0) {
          float* lb = lse + (long long)bh * Tq;
          if (st_a) lb[row_a] = (rs.m_a + log2f(l_a)) * LN2;
          if (st_b) lb[row_b] = (rs.m_b + log2f(l_b)) * LN2;
        }
      }
  return true;
}

}  // namespace awg
}  // namespace latch

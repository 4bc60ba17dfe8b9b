// Matrix product body on the worker (sm_90a): BF16/F16 operands loaded by TMA into the kernel's ring
// of shared-memory stages, wgmma into FP32 accumulators, a fused epilogue.
//
//   C[m, n] = sum_k A(m, k) * B(k, n)     over the task's box of C, in BM x BN sub-tiles
//
// Operand layouts (the node's trans flags; see latch_ops/matmul.py):
//   A_MN = false: a is stored [M, K] (K-major);  A_MN = true: a is stored [K, M] (M-major).
//   B_K  = true:  b is stored [N, K] (K-major);  B_K  = false: b is stored [K, N] (N-major).
// Shared memory of one stage (LATCH_STAGE_BYTES >= (BM + BN) * BK * 2), every row 128 bytes of 64
// elements, 128-byte swizzled by TMA:
//   A: K-major: BM rows of K;  M-major: BM/64 blocks of 64 K rows (8 KiB each).  Offset 0.
//   B: K-major: BN rows of K;  N-major: BN/64 blocks of 64 K rows.               Offset BM * 128.
// Consumer warpgroup w (of 2) computes rows [64w, 64w + 64) of each sub-tile: its A is the 8 KiB at
// offset 8192 * w in both layouts.
//
// Epilogues (``Epi``): GemmStore stores the accumulators from registers; GemmStoreTma stages them
// through shared memory and TMA stores, so the consumers go back to the next tile (and the next
// task) while the copy engine writes the tile out (see its comment for the hand-off rules).
//
// The producer half (gemm_produce, run by the worker's producer thread) and the consumer half
// (gemm_consume, run by the 256 consumer threads) walk the same sub-tiles and K blocks, so they
// agree on the ring position without talking; K blocks past ``k_end`` are never loaded (a split-K
// slice must end at a multiple of BK or at K).
// The CPU test (latch-ops tests/gemm_emulator, LATCH_EMULATED_GEMM) compiles this header against
// its own model of the worker and the hardware, so the guarded parts below are the hardware's only.
#pragma once

#ifndef LATCH_EMULATED_GEMM
#include "latch_common.cuh"
#include "latch_pipe.cuh"
#include "latch_sm90.cuh"
#include "latch_wgmma.cuh"
#endif

namespace latch {

constexpr int GEMM_BK = 64;

template <int BM, int BN, bool A_MN, bool B_K> struct GemmShape {
  static_assert(BM == 128, "the worker has two consumer warpgroups of 64 rows each");
  static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "wgmma N");
  static_assert(B_K || BN % 64 == 0, "an N-major B tile is whole 64-column blocks");
  static constexpr int A_BYTES = BM * GEMM_BK * 2;
  static constexpr int B_BYTES = BN * GEMM_BK * 2;
  static constexpr int STAGE = A_BYTES + B_BYTES;
};

// Producer: issue every K block of every sub-tile of the box [m_lo, m_hi) x [n_lo, n_hi).
template <int BM, int BN, bool A_MN, bool B_K>
__device__ __forceinline__ bool gemm_produce(Pipe& p, const void* map_a, const void* map_b, int m_lo, int m_hi,
                                             int n_lo, int n_hi, int k_begin, int k_end) {
  typedef GemmShape<BM, BN, A_MN, B_K> S;
  for (int m0 = m_lo; m0 < m_hi; m0 += BM) {
    for (int n0 = n_lo; n0 < n_hi; n0 += BN) {
      for (int k = k_begin; k < k_end; k += GEMM_BK) {
        if (!pipe_wait(&p.empty[p.stage], p.phase ^ 1u, p)) return false;
        char* st = p.at(p.stage);
        uint64_t* full = &p.full[p.stage];
        sm90::mbar_arrive_expect_tx(full, S::STAGE);
        if (A_MN) {
#pragma unroll
          for (int j = 0; j < BM / 64; ++j) sm90::tma_load_2d(st + 8192 * j, map_a, full, m0 + 64 * j, k);
        } else {
          sm90::tma_load_2d(st, map_a, full, k, m0);
        }
        char* sb = st + S::A_BYTES;
        if (B_K) {
          sm90::tma_load_2d(sb, map_b, full, k, n0);
        } else {
#pragma unroll
          for (int j = 0; j < BN / 64; ++j) sm90::tma_load_2d(sb + 8192 * j, map_b, full, n0 + 64 * j, k);
        }
        p.advance();
      }
    }
  }
  return true;
}

// Epilogue interface: ``epi.tile<BN>(acc, m0, n0, wg, warp, lane)`` gets one sub-tile's
// accumulators, ``epi.finish()`` is called once after the last. GemmStore: ``epi(m, n, v0, v1)``
// stores C[m, n] and C[m, n + 1] (n even relative to the sub-tile), skipping elements outside the
// task's box (``m >= m_hi``, ``n >= n_hi``: the sub-tiles overhang the box at its edges).
template <class TC> struct GemmStore {
  TC* c;
  long long ldc;
  int m_hi, n_hi;
  bool pairs;  // ldc even and c 8-byte aligned: store (v0, v1) as one vector
  __device__ __forceinline__ void operator()(int m, int n, float v0, float v1) const {
    if (m >= m_hi || n >= n_hi) return;
    TC* row = c + (long long)m * ldc;
    if (pairs && n + 1 < n_hi) {
      store_pair(row + n, v0, v1);
    } else {
      st<TC>(row, n, v0);
      if (n + 1 < n_hi) st<TC>(row, n + 1, v1);
    }
  }
  __device__ __forceinline__ static void store_pair(float* p, float a, float b) {
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
  }
  __device__ __forceinline__ static void store_pair(__nv_bfloat16* p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  }
  __device__ __forceinline__ static void store_pair(__half* p, float a, float b) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
  }
  // One BM x BN sub-tile at (m0, n0) from the accumulators of thread ``lane`` of warp ``warp`` of
  // consumer warpgroup ``wg`` (layout: latch_wgmma.cuh).
  template <int BN>
  __device__ __forceinline__ void tile(const float (&acc)[BN / 2], int m0, int n0, int wg, int warp, int lane) const {
    const int row = m0 + 64 * wg + 16 * warp + (lane >> 2);
    const int col = n0 + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      (*this)(row, col + 8 * j, acc[4 * j], acc[4 * j + 1]);
      (*this)(row + 8, col + 8 * j, acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
  __device__ __forceinline__ void cover() const {}  // (GemmStoreTma::cover: nothing to wait for here)
  __device__ __forceinline__ void finish() const {}
};

// The epilogue through shared memory and TMA stores. Each consumer warp owns SLOTS KiB of the body's
// scratch (gemm_tma_store_smem(SLOTS) in all, 1024-aligned): SLOTS slots of 1 KiB, each one
// 128-byte-swizzled box of 8 rows x 128 bytes (64 BF16 / 32 FP32 columns) of the warp's accumulators
// (rows 16 w + 8 h .. + 8, h = 0, 1). The warp's stored boxes take the slots in turn; before it writes
// a slot that an earlier box of this body used (``stored >= SLOTS``), lane 0 waits until at most
// SLOTS - 1 of its bulk groups are still reading (bulk_wait_read<SLOTS - 1>: one group per stored
// box, so the one that last read this slot, SLOTS boxes ago, is done). Then the warp writes the
// slot, fences it to the async proxy, and lane 0 issues the TMA store and commits. No named
// barrier: each warp's boxes are its own. SLOTS = 2 keeps the ring at 4 stages of the 128 x 256
// configuration; SLOTS = 8 holds a whole 128 x 256 BF16 tile's boxes (no wait within a tile: the
// stores drain while the next tile's products run) at the cost of a stage.
// Hand-off to the worker (latch_kernel_main.cuh): the body's first TMA epilogue waits until every
// earlier bulk store of this block completed (bulk_wait<0>: the tasks before this one are then
// really finished), and the body ends with its shared-memory sources read (bulk_wait_read<0>, so
// the next body may use the scratch) and ``*async_stores = 1``: its own stores may still be in
// flight, so the worker counts this task as finished only once a later wait covers them.
// Sub-tiles the task's box does not cover whole (never, when the box is the configuration's tile
// or ends at the tensor's edge) take the register path; TMA clips boxes at the tensor's edges.
constexpr int gemm_tma_store_smem(int slots) { return 8 * 1024 * slots; }

template <class TC, int SLOTS> struct GemmStoreTma {  // SLOTS: lower_matmul.py EPILOGUE_SLOTS or the node's epilogue_slots
  static_assert(SLOTS >= 1 && SLOTS <= 8, "1..8 slots of 1 KiB per consumer warp");
  GemmStore<TC> regs;  // the register path (and the box: regs.m_hi, regs.n_hi)
  const void* map;     // the output's tensor map: dims (N, M), box (128 / sizeof(TC), 8), 128-byte swizzle
  char* buf;           // gemm_tma_store_smem(SLOTS) bytes of shared memory, 1024-aligned
  int M, N;            // the output's extents
  int* async_stores;   // Ctx::async_stores
  bool waited = false;  // this body's first TMA epilogue has waited for every earlier store
  int stored = 0;       // boxes this warp stored in this body (its bulk groups, in order)

  // (a, b) rounded to TC at shared-memory address ``addr`` (st.shared: a generic store would go
  // through the address translation and cost more)
#ifdef LATCH_EMULATED_GEMM
  template <class X> static void put(uint32_t addr, float a, float b, X*) { emu::put_shared<X>(addr, a, b); }
#else
  __device__ __forceinline__ static void put(uint32_t addr, float a, float b, __nv_bfloat16*) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(*reinterpret_cast<uint32_t*>(&v)) : "memory");
  }
  __device__ __forceinline__ static void put(uint32_t addr, float a, float b, __half*) {
    __half2 v = __floats2half2_rn(a, b);
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(*reinterpret_cast<uint32_t*>(&v)) : "memory");
  }
  __device__ __forceinline__ static void put(uint32_t addr, float a, float b, float*) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
  }
#endif

  template <int BN>
  __device__ __forceinline__ void tile(const float (&acc)[BN / 2], int m0, int n0, int wg, int warp, int lane) {
    constexpr int CW = 128 / (int)sizeof(TC);  // columns per 128-byte box row
    constexpr int JPC = CW / 8;                 // accumulator column groups (8 columns each) per box
    const bool whole = (m0 + 128 <= regs.m_hi || regs.m_hi == M) && (n0 + BN <= regs.n_hi || regs.n_hi == N);
    if (BN % CW != 0 || !whole) {
      regs.template tile<BN>(acc, m0, n0, wg, warp, lane);
      return;
    }
    if (!waited) {
      if (lane == 0) sm90::bulk_wait<0>();
      waited = true;
    }
    // The slots of the warp that runs this (threadIdx.x / 32): the same as 4 wg + warp when each
    // warpgroup stores its own rows, and still the caller's own when one warpgroup stores both
    // halves of a tile (the ping-pong body, latch_gemm_pingpong.cuh).
    char* wbuf = buf + 1024 * SLOTS * ((int)(threadIdx.x >> 5) & 7);
    const int r = lane >> 2, q4 = lane & 3;
    const int row0 = m0 + 64 * wg + 16 * warp;
#pragma unroll
    for (int q = 0; q < (BN % CW == 0 ? BN / CW : 1); ++q) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = row0 + 8 * h, cc = n0 + q * CW;
        if (rr >= M || cc >= N) continue;  // the box lies outside the output (warp-uniform): nothing to write
        char* slot = wbuf + 1024 * (stored % SLOTS);
        if (stored >= SLOTS) {  // this slot's last reader is the group SLOTS boxes ago
          if (lane == 0) sm90::bulk_wait_read<SLOTS - 1>();
          __syncwarp();
        }
#pragma unroll
        for (int jj = 0; jj < JPC; ++jj) {
          const int j = q * JPC + jj;
          const int byte = (int)sizeof(TC) * (8 * jj + 2 * q4);
          put(sm90::smem_addr(slot) + 128 * r + (((byte >> 4) ^ r) << 4) + (byte & 15), acc[4 * j + 2 * h],
              acc[4 * j + 2 * h + 1], (TC*)nullptr);
        }
        sm90::fence_proxy_async_shared();
        __syncwarp();
        if (lane == 0) {
          sm90::tma_store_2d(map, slot, cc, rr);
          sm90::bulk_commit();
        }
        ++stored;
      }
    }
  }
  // Every earlier store of this warp complete, as a TMA epilogue would have waited for it: a warp
  // that stored nothing in a body (a ping-pong warpgroup without a sub-tile) calls it before
  // finish(), so that every consumer thread ends the body with the same ``*async_stores``.
  __device__ __forceinline__ void cover() {
    if (waited) return;
    if ((threadIdx.x & 31) == 0) sm90::bulk_wait<0>();
    waited = true;
  }
  __device__ __forceinline__ void finish() {
    if (!waited) return;
    if ((threadIdx.x & 31) == 0) sm90::bulk_wait_read<0>();
    __syncwarp();
    *async_stores = 1;
  }
};

template <int N, int TA, int TB, class T> struct Wgmma;
#define LATCH_WGMMA_CASE(N)                                                                          \
  template <int TA, int TB> struct Wgmma<N, TA, TB, __nv_bfloat16> {                                 \
    __device__ __forceinline__ static void run(float (&d)[N / 2], uint64_t a, uint64_t b, int s) {   \
      sm90::wgmma_bf16_m64n##N##k16<TA, TB>(d, a, b, s);                                             \
    }                                                                                                \
  };                                                                                                 \
  template <int TA, int TB> struct Wgmma<N, TA, TB, __half> {                                        \
    __device__ __forceinline__ static void run(float (&d)[N / 2], uint64_t a, uint64_t b, int s) {   \
      sm90::wgmma_f16_m64n##N##k16<TA, TB>(d, a, b, s);                                              \
    }                                                                                                \
  };
LATCH_WGMMA_CASE(16)
LATCH_WGMMA_CASE(32)
LATCH_WGMMA_CASE(64)
LATCH_WGMMA_CASE(96)
LATCH_WGMMA_CASE(128)
LATCH_WGMMA_CASE(192)
LATCH_WGMMA_CASE(256)
#undef LATCH_WGMMA_CASE

// One K block on the consumer side: wait for the stage, issue its four wgmma (K = 16 each) and
// commit them as one group. False (nothing left in flight) if the launch was aborted.
template <class T, int BN, bool A_MN, bool B_K, bool FIRST>
__device__ __forceinline__ bool gemm_k_block(Pipe& p, float (&acc)[BN / 2], int wg) {
  if (!pipe_wait_warp(&p.full[p.stage], p.phase, p)) {
    sm90::wgmma_wait<0>();  // nothing may be in flight when the body leaves
    return false;
  }
  const char* st = p.at(p.stage);
  const char* sa = st + 8192 * wg;
  const char* sb = st + GemmShape<128, BN, A_MN, B_K>::A_BYTES;
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < GEMM_BK / 16; ++kk) {
    const uint64_t da = A_MN ? sm90::wgmma_desc(sa + 2048 * kk, 8192, 1024) : sm90::wgmma_desc(sa + 32 * kk, 16, 1024);
    const uint64_t db = B_K ? sm90::wgmma_desc(sb + 32 * kk, 16, 1024) : sm90::wgmma_desc(sb + 2048 * kk, 8192, 1024);
    Wgmma<BN, A_MN ? 1 : 0, B_K ? 0 : 1, T>::run(acc, da, db, (FIRST && kk == 0) ? 0 : 1);
  }
  sm90::wgmma_commit();
  return true;
}

// Consumer: threads 0..255 (two warpgroups). Returns false if the launch was aborted.
template <class T, int BM, int BN, bool A_MN, bool B_K, class Epi>
__device__ __forceinline__ bool gemm_consume(Pipe& p, Epi& epi, int m_lo, int m_hi, int n_lo, int n_hi,
                                             int k_begin, int k_end) {
  typedef GemmShape<BM, BN, A_MN, B_K> S;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int nk = (k_end - k_begin + GEMM_BK - 1) / GEMM_BK;
  for (int m0 = m_lo; m0 < m_hi; m0 += BM) {
    for (int n0 = n_lo; n0 < n_hi; n0 += BN) {
      float acc[BN / 2];
      if (nk > 0) {
        // The first K block overwrites the accumulators (scale_d = 0 on its first step); later
        // blocks accumulate, each waiting only for the block before it (one wgmma group in flight
        // while the next stage is awaited), then handing that block's stage back to the producer.
        if (!gemm_k_block<T, BN, A_MN, B_K, true>(p, acc, wg)) return false;
        uint32_t prev = p.stage;
        p.advance();
#pragma unroll 1
        for (int kb = 1; kb < nk; ++kb) {
          if (!gemm_k_block<T, BN, A_MN, B_K, false>(p, acc, wg)) return false;
          sm90::wgmma_wait<1>();
          if (lane == 0) sm90::mbar_arrive(&p.empty[prev]);
          prev = p.stage;
          p.advance();
        }
        sm90::wgmma_wait<0>();
        if (lane == 0) sm90::mbar_arrive(&p.empty[prev]);
      } else {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;  // K = 0: the product is zero
      }
      epi.template tile<BN>(acc, m0, n0, wg, warp, lane);
    }
  }
  epi.finish();
  return true;
}

}  // namespace latch

// The ping-pong matrix product body (sm_90a): the same operands, ring and epilogues as latch_gemm.cuh,
// but each consumer warpgroup computes WHOLE 128 x 128 sub-tiles of the task's box, the two taking
// them in turn (sub-tile t, in the producer's order, belongs to warpgroup t % 2). While one
// warpgroup drains its last K block and runs its epilogue (registers -> shared -> TMA store), the
// other's products keep the tensor cores busy: the tile transition that the cooperative body
// (both warpgroups on rows of one tile) pays in full on every tile is hidden for all but the last
// sub-tile of a task (results/gpu.md run 20: ~2.5 us of ~12.7 us per 128 x 256 tile at K = 768).
//
// The producer half is gemm_produce<128, 128, A_MN, B_K> unchanged: it fills the ring with every
// K block of sub-tile 0, then of sub-tile 1, ... Each warpgroup walks the same sequence and skips
// the other's blocks (Pipe::advance), so both agree on the ring position.
// Turns: warpgroup w starts the K loop of sub-tile t > 0 only after the other finished ISSUING
// sub-tile t - 1's (named barrier GEMM_PP_TURN + w: the other arrives, w syncs; 256 threads). This
// is what makes the parity waits sound: an mbarrier wait on parity only tells the awaited phase
// from the one just before it, and a warpgroup that skipped the other's stages could otherwise
// wait on a stage's full barrier one use ahead of it (the earlier use's loads not even issued)
// and pass at once (the CPU model caught it: tests/test_gemm_emulated.py). With the turn, every
// earlier use of each stage has been waited for (loaded) when a warpgroup first waits on it, and
// the next use cannot complete before this warpgroup releases the stage. The products of the two
// sub-tiles still overlap: the turn passes as soon as the last K block is issued, before its
// wgmma drain and the epilogue, which run under the other warpgroup's products (the ordering of
// CUTLASS's ping-pong kernel, written here from the idea).
// An aborted launch keeps the turns: a warpgroup whose wait failed stops waiting on stages but
// still syncs and arrives for each remaining sub-tile, so neither is left at a named barrier.
//
// Stage layout: latch_gemm.cuh's with BN = 128 (A 128 x 64 at offset 0, B 128 x 64 at 16 KiB).
// Warpgroup w's sub-tile uses BOTH 64-row halves of A (offsets 0 and 8 KiB), with two FP32
// accumulator sets of 64 registers (m64n128 wgmma each, sharing B's descriptor).
// Stage release: a stage's ``empty`` mbarrier expects one arrival per consumer warp (8); only the
// four warps of the warpgroup that read it arrive, with a count of 2 each.
// Epilogues: any latch_gemm.cuh epilogue (GemmStore, GemmStoreTma): the warpgroup calls
// ``epi.tile<128>`` for rows 0-63 (wg = 0) and 64-127 (wg = 1) of its sub-tile; GemmStoreTma stages
// through the slots of the warp that runs it. A warpgroup left without a sub-tile (a box of one
// sub-tile) still waits for its warps' earlier stores (``epi.cover()``) so that every consumer
// thread ends the body alike (the worker reads ``Ctx::async_stores`` per thread).
#pragma once

#include "latch_gemm.cuh"

namespace latch {

constexpr int GEMM_PP_BN = 128;  // the sub-tile a warpgroup owns: 128 x GEMM_PP_BN
constexpr int GEMM_PP_TURN = 14;  // named barriers 14 + w: warpgroup w's turn (latch_kernel_main.cuh's list)

#ifndef LATCH_EMULATED_GEMM  // (the CPU test's model brings its own)
// Arrive ``count`` times at once (the reading warpgroup arrives for the other's warps too).
__device__ __forceinline__ void mbar_arrive_count(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(sm90::smem_addr(bar)), "r"(count) : "memory");
}
// Give warpgroup ``to`` its turn (every thread of the other warpgroup arrives; no wait).
__device__ __forceinline__ void gemm_pp_pass_turn(int to) {
  asm volatile("bar.arrive %0, 256;" ::"r"(GEMM_PP_TURN + to) : "memory");
}
// Wait for this warpgroup's turn (``wg``).
__device__ __forceinline__ void gemm_pp_take_turn(int wg) {
  asm volatile("bar.sync %0, 256;" ::"r"(GEMM_PP_TURN + wg) : "memory");
}
#endif

// One K block of a whole 128 x 128 sub-tile on one warpgroup: wait for the stage, issue eight wgmma
// (four K steps of 16, two 64-row halves) as one group. False if the launch was aborted.
template <class T, bool A_MN, bool B_K, bool FIRST>
__device__ __forceinline__ bool gemm_pp_k_block(Pipe& p, float (&acc0)[GEMM_PP_BN / 2], float (&acc1)[GEMM_PP_BN / 2]) {
  if (!pipe_wait_warp(&p.full[p.stage], p.phase, p)) {
    sm90::wgmma_wait<0>();  // nothing may be in flight when the body leaves
    return false;
  }
  const char* st = p.at(p.stage);
  const char* sb = st + GemmShape<128, GEMM_PP_BN, A_MN, B_K>::A_BYTES;
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < GEMM_BK / 16; ++kk) {
    const uint64_t da0 = A_MN ? sm90::wgmma_desc(st + 2048 * kk, 8192, 1024) : sm90::wgmma_desc(st + 32 * kk, 16, 1024);
    const uint64_t da1 = A_MN ? sm90::wgmma_desc(st + 8192 + 2048 * kk, 8192, 1024)
                              : sm90::wgmma_desc(st + 8192 + 32 * kk, 16, 1024);
    const uint64_t db = B_K ? sm90::wgmma_desc(sb + 32 * kk, 16, 1024) : sm90::wgmma_desc(sb + 2048 * kk, 8192, 1024);
    const int scale = (FIRST && kk == 0) ? 0 : 1;
    Wgmma<GEMM_PP_BN, A_MN ? 1 : 0, B_K ? 0 : 1, T>::run(acc0, da0, db, scale);
    Wgmma<GEMM_PP_BN, A_MN ? 1 : 0, B_K ? 0 : 1, T>::run(acc1, da1, db, scale);
  }
  sm90::wgmma_commit();
  return true;
}

// The turns left in the box after warpgroup ``wg`` gave up on sub-tile ``t`` (its own; its turn
// taken; nothing in flight): pass and take them as the K loops would have, so that neither
// warpgroup is left at a named barrier (they have no timeout). Returns false (aborted).
__device__ __noinline__ bool gemm_pp_abort(int t, int subs, int wg) {
  if (t + 1 < subs) gemm_pp_pass_turn(wg ^ 1);
  for (int u = t + 2; u < subs; u += 2) {
    gemm_pp_take_turn(wg);
    if (u + 1 < subs) gemm_pp_pass_turn(wg ^ 1);
  }
  return false;
}

// Consumer: threads 0..255; warpgroup wg takes sub-tiles wg, wg + 2, ... of the box (in
// gemm_produce's order: M blocks outer, N blocks inner). Returns false if the launch was aborted.
template <class T, bool A_MN, bool B_K, class Epi>
__device__ __forceinline__ bool gemm_pp_consume(Pipe& p, Epi& epi, int m_lo, int m_hi, int n_lo, int n_hi,
                                                int k_begin, int k_end) {
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int nk = (k_end - k_begin + GEMM_BK - 1) / GEMM_BK;
  const int subs = ((m_hi - m_lo + 127) / 128) * ((n_hi - n_lo + GEMM_PP_BN - 1) / GEMM_PP_BN);
  int t = 0;
  for (int m0 = m_lo; m0 < m_hi; m0 += 128) {
    for (int n0 = n_lo; n0 < n_hi; n0 += GEMM_PP_BN, ++t) {
      if ((t & 1) != wg) {  // the other warpgroup's sub-tile: skip its stages
#pragma unroll 1
        for (int i = 0; i < nk; ++i) p.advance();
        continue;
      }
      if (t > 0) gemm_pp_take_turn(wg);  // the other issued every K block of sub-tile t - 1
      float acc0[GEMM_PP_BN / 2], acc1[GEMM_PP_BN / 2];
      if (nk > 0) {
        // As gemm_consume: one wgmma group in flight while the next stage is awaited; a block's
        // stage goes back to the producer once the group after it was issued and it completed.
        if (!gemm_pp_k_block<T, A_MN, B_K, true>(p, acc0, acc1)) return gemm_pp_abort(t, subs, wg);
        uint32_t prev = p.stage;
        p.advance();
#pragma unroll 1
        for (int kb = 1; kb < nk; ++kb) {
          if (!gemm_pp_k_block<T, A_MN, B_K, false>(p, acc0, acc1)) return gemm_pp_abort(t, subs, wg);
          sm90::wgmma_wait<1>();
          if (lane == 0) mbar_arrive_count(&p.empty[prev], 2);
          prev = p.stage;
          p.advance();
        }
        if (t + 1 < subs) gemm_pp_pass_turn(wg ^ 1);  // every K block issued: the other may start
        sm90::wgmma_wait<0>();
        if (lane == 0) mbar_arrive_count(&p.empty[prev], 2);
      } else {
        if (t + 1 < subs) gemm_pp_pass_turn(wg ^ 1);
#pragma unroll
        for (int i = 0; i < GEMM_PP_BN / 2; ++i) acc0[i] = acc1[i] = 0.f;  // K = 0: the product is zero
      }
      epi.template tile<GEMM_PP_BN>(acc0, m0, n0, 0, warp, lane);
      epi.template tile<GEMM_PP_BN>(acc1, m0, n0, 1, warp, lane);
    }
  }
  epi.cover();
  epi.finish();
  return true;
}

}  // namespace latch

// route_order's bodies (latch_ops/moe/specs.py): the stable sort of the (token, slot) pairs by
// expert, in one block. Integer arithmetic and shared memory only, so the CPU test
// (latch-ops tests/test_route_emulated.py) compiles this header against its own model of a block
// (route_emulator/) and checks every output against the reference, bit for bit.
#pragma once

#ifndef LATCH_EMULATED_ROUTE
#include "latch_common.cuh"
#endif

namespace latch {

// The whole route_order in one block: counts, offsets, then a stable rank of every (token, slot)
// pair among the pairs of its expert, 256 pairs at a time. smem: E + 256 ints.
template <class TI, class TO>
__device__ void route_order_all(const TI* indices, TO* token, TO* position, TO* offsets, long long N, int k,
                                long long E, int* smem) {
  int* run = smem;            // [E]: counts, then the next free row of each expert
  int* chunk = smem + E;      // [LATCH_THREADS]: the experts of the current chunk of pairs
  const long long P = N * (long long)k;
  for (long long e = threadIdx.x; e < E; e += LATCH_THREADS) run[e] = 0;
  latch::block_sync();
  for (long long p = threadIdx.x; p < P; p += LATCH_THREADS) {
    const long long e = (long long)indices[p];
    if (e < 0 || e >= E) {
      latch_report(ERR_INDEX_RANGE, e, E);
      continue;
    }
    atomicAdd(&run[e], 1);
  }
  latch::block_sync();
  if (threadIdx.x == 0) {
    int acc = 0;
    for (long long e = 0; e < E; ++e) {
      const int c = run[e];
      offsets[e] = (TO)acc;
      run[e] = acc;
      acc += c;
    }
    offsets[E] = (TO)acc;
  }
  latch::block_sync();
  for (long long base = 0; base < P; base += LATCH_THREADS) {
    const long long p = base + threadIdx.x;
    long long e = p < P ? (long long)indices[p] : -1;
    if (e < 0 || e >= E) e = -1;
    chunk[threadIdx.x] = (int)e;
    latch::block_sync();
    if (e >= 0) {
      int rank = 0;
      for (int q = 0; q < (int)threadIdx.x; ++q) rank += chunk[q] == (int)e;
      const long long row = run[e] + rank;
      token[row] = (TO)(p / k);
      position[p] = (TO)row;
    }
    latch::block_sync();
    if (e >= 0) atomicAdd(&run[e], 1);
    latch::block_sync();
  }
}

constexpr int ROUTE_FAST_EXPERTS = 256;  // = lower_moe.FAST_EXPERTS: route_order_warps' block scan
static_assert(ROUTE_FAST_EXPERTS <= LATCH_THREADS, "one thread per expert in the offsets' scan");

// route_order in one block for up to ROUTE_FAST_EXPERTS experts, in two passes over the pairs with
// one block barrier between them (run 29: route_order_match, 16 chunks of 256 pairs at TinyMoE's
// 4,096, each a dependent global load and four block barriers, took ~20 us as one task per layer
// while 131 SMs waited). Warp w owns the contiguous pairs [w * per, (w + 1) * per) (per a multiple
// of 32), so pair order is (warp, round, lane) order. Pass 1 counts each warp's pairs per expert
// (__match_any_sync groups equal experts in a round; the group's first lane adds its size to the
// warp's own row of ``cnt``: no atomics, the warp's rounds in order). A block scan of the totals
// gives the offsets, and each warp's row of ``cnt`` becomes the first sorted row of each expert
// in that warp's pairs (offsets[e] + the counts of the warps before it). Pass 2 walks the same pairs
// again: a pair's row is its warp's next row of its expert plus its rank among the equal lanes
// below it. Integer arithmetic only, and the result is the one stable sort: the same bits as
// route_order_all. Indices are loaded ROUTE_BATCH rounds at a time, so the
// loads' latencies overlap. smem: (LATCH_THREADS / 32) * (E + 1) ints.
constexpr int ROUTE_BATCH = 8;

template <class TI, class TO>
__device__ void route_order_warps(const TI* indices, TO* token, TO* position, TO* offsets, long long N, int k,
                                  long long E, int* smem) {
  constexpr int W = LATCH_THREADS / 32;
  int* cnt = smem;          // [W][E]: counts of each warp's pairs, then each warp's next row per expert
  int* wsum = smem + W * E;  // [W]: the scan's warp totals
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned below = (1u << lane) - 1u;
  const long long P = N * (long long)k;
  const long long per = ((P + W - 1) / W + 31) / 32 * 32;
  const long long p_lo = min(P, warp * per), p_hi = min(P, p_lo + per);
  int* mine = cnt + warp * E;
  for (long long i = tid; i < W * E; i += LATCH_THREADS) cnt[i] = 0;
  latch::block_sync();
  for (int pass = 0; pass < 2; ++pass) {
    for (long long base = p_lo; base < p_hi; base += 32 * ROUTE_BATCH) {
      int ex[ROUTE_BATCH];
#pragma unroll
      for (int j = 0; j < ROUTE_BATCH; ++j) {  // independent loads, all in flight together
        const long long p = base + 32 * j + lane;
        long long e = p < p_hi ? (long long)indices[p] : -1;
        if (p < p_hi && (e < 0 || e >= E)) {
          if (pass == 0) latch_report(ERR_INDEX_RANGE, e, E);
          e = -1;
        }
        ex[j] = (int)e;
      }
#pragma unroll
      for (int j = 0; j < ROUTE_BATCH; ++j) {
        if (base + 32 * j >= p_hi) break;  // warp-uniform
        const int e = ex[j];
        const unsigned same = __match_any_sync(0xffffffffu, e);
        const bool first = e >= 0 && (same & below) == 0;
        if (pass == 1 && e >= 0) {
          const long long p = base + 32 * j + lane;
          const long long row = (long long)mine[e] + __popc(same & below);
          token[row] = (TO)(p / k);
          position[p] = (TO)row;
        }
        __syncwarp();  // every lane read mine[e] before its group's first lane moves it on
        if (first) mine[e] += __popc(same);
        __syncwarp();
      }
    }
    if (pass == 1) break;
    latch::block_sync();  // every warp's counts final
    // offsets: an exclusive scan of the totals over the experts (thread e holds expert e's)
    int tot = 0;
    if (tid < E)
      for (int w = 0; w < W; ++w) tot += cnt[w * E + tid];
    int inc = tot;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += v;
    }
    if (lane == 31) wsum[warp] = inc;
    latch::block_sync();
    int before = 0;
    for (int w = 0; w < warp; ++w) before += wsum[w];
    if (tid < E) {
      int row = before + inc - tot;
      offsets[tid] = (TO)row;
      for (int w = 0; w < W; ++w) {
        const int c = cnt[w * E + tid];
        cnt[w * E + tid] = row;
        row += c;
      }
    }
    if (tid == LATCH_THREADS - 1) offsets[E] = (TO)(before + inc);  // every valid pair
    latch::block_sync();  // each warp's first rows written
  }
}

}  // namespace latch

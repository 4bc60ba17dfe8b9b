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


// ---------------------------------------------------------------------------------------------
// route_order over many SMs (latch_ops.moe.route_split): the P = N * k pairs fall into chunks of
// `chunk` pairs (the last may be short), C of them, and the sort takes two phases of tasks:
//   route_count   one task per chunk: the chunk's per-expert counts, a row of counts[C][E] (int32);
//   route_place   one task per chunk: position[p] for the chunk's pairs (the sorted row of each);
//   route_rows    one task per chunk of sorted rows: token[r] and pairs[r] (the pair at row r, the
//                 inverse of position, which the MoE backward's combine gathers by);
//   route_offsets one task: offsets[E + 1].
// Every task of the second phase reads the whole counts matrix (C * E ints), so it knows where each
// chunk's pairs of each expert start among the sorted rows: cum[c][e] = the pairs of expert e in
// chunks before c. Integer arithmetic only, no atomics but integer ones on shared counters, and
// the result is the one stable sort: the same bits as route_order_warps (test_route_emulated.py).
// Invalid indices (outside [0, E)) are reported by route_count and skipped by the others, as
// route_order_warps does: offsets[E] counts the valid pairs.
constexpr int ROUTE_SPLIT_EXPERTS = 64;  // = latch_ops.moe.route_split.MAX_EXPERTS
static_assert(ROUTE_SPLIT_EXPERTS <= 64 && ROUTE_SPLIT_EXPERTS <= LATCH_THREADS / 4,
              "route_prefix: two experts a lane of one warp, at least four threads an expert");

// route_count: the pairs [p0, p1) of one chunk -> counts_row[0..E). smem: E ints.
template <class TI, class TC>
__device__ void route_count(const TI* indices, TC* counts_row, long long p0, long long p1, long long E, int* smem) {
  constexpr int W = LATCH_THREADS / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned below = (1u << lane) - 1u;
  for (long long e = tid; e < E; e += LATCH_THREADS) smem[e] = 0;
  latch::block_sync();
  for (long long base = p0 + 32LL * ROUTE_BATCH * warp; base < p1; base += 32LL * ROUTE_BATCH * W) {
    int ex[ROUTE_BATCH];
#pragma unroll
    for (int j = 0; j < ROUTE_BATCH; ++j) {  // independent loads, all in flight together
      const long long p = base + 32 * j + lane;
      long long e = p < p1 ? (long long)indices[p] : -1;
      if (p < p1 && (e < 0 || e >= E)) {
        latch_report(ERR_INDEX_RANGE, e, E);
        e = -1;
      }
      ex[j] = (int)e;
    }
#pragma unroll
    for (int j = 0; j < ROUTE_BATCH; ++j) {
      if (base + 32 * j >= p1) break;  // warp-uniform
      const unsigned same = __match_any_sync(0xffffffffu, ex[j]);
      if (ex[j] >= 0 && (same & below) == 0) atomicAdd(&smem[ex[j]], __popc(same));  // one add per expert group
    }
  }
  latch::block_sync();
  for (long long e = tid; e < E; e += LATCH_THREADS) counts_row[e] = (TC)smem[e];
}

// The counts' prefix sums, which every task of the second phase needs: cum[c * E + e] for c in
// [0, C], the pairs of expert e in the chunks before c (row C: the totals), and off[e] for e in
// [0, E], expert e's first sorted row (off[E]: the valid pairs). The C * E counts are loaded by all
// threads at once (independent loads, coalesced); each expert's column is summed by
// LATCH_THREADS / E threads, a segment of chunks each, and a warp scan over the experts gives off.
// smem: cum (C + 1) * E ints, off E + 1, seg LATCH_THREADS. E <= ROUTE_SPLIT_EXPERTS.
template <class TC>
__device__ void route_prefix(const TC* counts, long long C, long long E, int* cum, int* off, int* seg) {
  const int tid = threadIdx.x, lane = tid & 31;
  for (long long i = tid; i < C * E; i += LATCH_THREADS) cum[i] = (int)counts[i];
  latch::block_sync();
  const long long S = LATCH_THREADS / E, per = (C + S - 1) / S;  // segments of chunks per expert
  const long long e = tid % E, s = tid / E;
  const long long c_lo = min(C, s * per), c_hi = min(C, c_lo + per);
  if (s < S) {
    int sum = 0;
    for (long long c = c_lo; c < c_hi; ++c) sum += cum[c * E + e];
    seg[s * E + e] = sum;
  }
  latch::block_sync();
  if (s < S) {
    int acc = 0;
    for (long long q = 0; q < s; ++q) acc += seg[q * E + e];
    for (long long c = c_lo; c < c_hi; ++c) {  // this thread's own chunks: in place
      const int v = cum[c * E + e];
      cum[c * E + e] = acc;
      acc += v;
    }
    if (s == S - 1) cum[C * E + e] = acc;  // the last segment ends at the total
  }
  latch::block_sync();
  if (tid < 32) {  // off: an exclusive scan of the totals, two experts a lane
    const long long e0 = 2 * tid, e1 = e0 + 1;
    const int t0 = e0 < E ? cum[C * E + e0] : 0, t1 = e1 < E ? cum[C * E + e1] : 0;
    int inc = t0 + t1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += v;
    }
    if (e0 < E) off[e0] = inc - t0 - t1;
    if (e1 < E) off[e1] = inc - t1;
    if (tid == 31) off[E] = inc;
  }
  latch::block_sync();
}

// route_place: position[p] for the pairs of chunks [c0, c1) (a task's tile is whole chunks).
// Within a chunk warp w owns the contiguous pairs [w * per, (w + 1) * per) (per a multiple of 32),
// pass 1 counts each warp's pairs per expert into its row of cnt, a scan over the warps turns the
// rows into each warp's first sorted row per expert (from route_prefix's off and cum), and pass 2
// ranks each pair among the equal lanes below it. smem: route_prefix's, then W * E ints.
template <class TI, class TC, class TO>
__device__ void route_place(const TI* indices, const TC* counts, TO* position, long long P, long long chunk, long long C,
                            long long E, long long c0, long long c1, int* smem) {
  constexpr int W = LATCH_THREADS / 32;
  int* cum = smem;                   // [C + 1][E]
  int* off = cum + (C + 1) * E;      // [E + 1]
  int* seg = off + E + 1;            // [LATCH_THREADS]
  int* cnt = seg + LATCH_THREADS;    // [W][E]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned below = (1u << lane) - 1u;
  route_prefix(counts, C, E, cum, off, seg);
  for (long long c = c0; c < c1; ++c) {
    const long long q0 = c * chunk, q1 = min(P, q0 + chunk);
    for (long long i = tid; i < W * E; i += LATCH_THREADS) cnt[i] = 0;
    latch::block_sync();
    const long long per = ((q1 - q0 + W - 1) / W + 31) / 32 * 32;
    const long long lo = min(q1, q0 + warp * per), hi = min(q1, lo + per);
    int* mine = cnt + warp * E;
    for (int pass = 0; pass < 2; ++pass) {
      for (long long base = lo; base < hi; base += 32 * ROUTE_BATCH) {
        int ex[ROUTE_BATCH];
#pragma unroll
        for (int j = 0; j < ROUTE_BATCH; ++j) {
          const long long p = base + 32 * j + lane;
          const long long e = p < hi ? (long long)indices[p] : -1;
          ex[j] = (e < 0 || e >= E) ? -1 : (int)e;
        }
#pragma unroll
        for (int j = 0; j < ROUTE_BATCH; ++j) {
          if (base + 32 * j >= hi) break;  // warp-uniform
          const int e = ex[j];
          const unsigned same = __match_any_sync(0xffffffffu, e);
          if (pass == 1 && e >= 0) position[base + 32 * j + lane] = (TO)(mine[e] + __popc(same & below));
          __syncwarp();  // every lane read mine[e] before its group's first lane moves it on
          if (e >= 0 && (same & below) == 0) mine[e] += __popc(same);
          __syncwarp();
        }
      }
      if (pass == 1) break;
      latch::block_sync();  // every warp's counts final
      if (tid < E) {
        int row = off[tid] + cum[c * E + tid];
        for (int w = 0; w < W; ++w) {
          const int n = cnt[w * E + tid];
          cnt[w * E + tid] = row;
          row += n;
        }
      }
      latch::block_sync();  // each warp's first rows written
    }
    latch::block_sync();  // the chunk's counters are free again
  }
}

// The largest c in [0, C) with cum(c) <= a, cum(c) = col[c * E] (non-decreasing, cum(0) = 0).
__device__ __forceinline__ long long route_chunk_at(const int* col, long long C, long long E, int a) {
  long long lo = 0, hi = C - 1;
  while (lo < hi) {
    const long long mid = (lo + hi + 1) / 2;
    if (col[mid * E] <= a) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// route_rows: token[r] and pairs[r] for the sorted rows [r0, r1). The rows of expert e are
// offsets[e] + ranks, and the counts say which chunks hold ranks [a, b) of e: a work item is one
// (expert, chunk) pair, dealt round-robin to the warps, and walks the chunk's pairs with a ballot
// of e's lanes, from the rank cum[c][e]. smem: route_prefix's.
template <class TI, class TC, class TO>
__device__ void route_rows(const TI* indices, const TC* counts, TO* token, TO* pairs, long long P, int k,
                           long long chunk, long long C, long long E, long long r0, long long r1, int* smem) {
  constexpr int W = LATCH_THREADS / 32;
  int* cum = smem;                 // [C + 1][E]: pairs of expert e in the chunks before c
  int* off = cum + (C + 1) * E;    // [E + 1]
  int* seg = off + E + 1;          // [LATCH_THREADS]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned below = (1u << lane) - 1u;
  route_prefix(counts, C, E, cum, off, seg);
  long long item = 0;
  for (long long e = 0; e < E; ++e) {
    const long long lo = max(r0, (long long)off[e]), hi = min(r1, (long long)off[e + 1]);
    if (lo >= hi) continue;
    const int a = (int)(lo - off[e]), b = (int)(hi - off[e]);
    const int* col = cum + e;
    for (long long c = route_chunk_at(col, C, E, a); c < C && col[c * E] < b; ++c) {
      if (col[(c + 1) * E] == col[c * E]) continue;  // no pair of e in chunk c
      if (item++ % W != warp) continue;
      int rank = col[c * E];
      const long long q1 = min(P, (c + 1) * chunk);
      for (long long base = c * chunk; base < q1 && rank < b; base += 32 * ROUTE_BATCH) {
        long long ex[ROUTE_BATCH];
#pragma unroll
        for (int j = 0; j < ROUTE_BATCH; ++j) {
          const long long p = base + 32 * j + lane;
          ex[j] = p < q1 ? (long long)indices[p] : -1;
        }
#pragma unroll
        for (int j = 0; j < ROUTE_BATCH; ++j) {
          const bool hit = ex[j] == e;
          const unsigned m = __ballot_sync(0xffffffffu, hit);
          const int r = rank + __popc(m & below);
          if (hit && r >= a && r < b) {
            const long long p = base + 32 * j + lane, row = off[e] + r;
            token[row] = (TO)(p / k);
            pairs[row] = (TO)p;
          }
          rank += __popc(m);
        }
      }
    }
  }
}

// route_offsets: offsets[0..E] from the counts matrix, in one task. smem: route_prefix's.
template <class TC, class TO>
__device__ void route_offsets(const TC* counts, TO* offsets, long long C, long long E, int* smem) {
  int* off = smem + (C + 1) * E;
  route_prefix(counts, C, E, smem, off, off + E + 1);
  for (long long e = threadIdx.x; e <= E; e += LATCH_THREADS) offsets[e] = (TO)off[e];
}

}  // namespace latch

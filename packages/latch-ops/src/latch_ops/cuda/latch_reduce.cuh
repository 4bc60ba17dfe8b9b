// Reductions over arbitrary dims, for a tile of the output.
//
// The generated body supplies index functors (constants baked in per signature):
//   base(o)  -> input element offset of output element o of the tile (o in [0, n_out))
//   off(r)   -> input offset of reduced element r (r in [0, R)) relative to base
//   load(i)  -> the input element at offset i, in the accumulator type
//   store(o, acc) writes output element o
// One thread reduces one output element (a few reduced elements), one warp does (short reductions),
// or the whole block does (long ones).
#pragma once

#include "latch_common.cuh"

namespace latch {

template <class Acc, class Op, class Base, class Off, class Load, class Store>
__device__ __forceinline__ void reduce_warp_per_output(long long n_out, long long R, Base base, Off off, Load load,
                                                       Store store) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = LATCH_THREADS >> 5;
  for (long long o = warp; o < n_out; o += nw) {
    const long long b = base(o);
    Acc acc = Op::template init<Acc>();
    for (long long r = lane; r < R; r += 32) acc = Op::apply(acc, load(b + off(r)));
    acc = warp_reduce<Op>(acc);
    if (lane == 0) store(o, acc);
  }
}

// One thread reduces one output element, its R elements in index order: for a handful of reduced
// elements (split-K partials: R = S) a warp per output would leave 32 - R lanes idle and spend a
// shuffle tree per element; here consecutive threads take consecutive outputs (coalesced when the
// reduced dims are not the innermost) and each issues its R independent loads at once.
template <class Acc, class Op, class Base, class Off, class Load, class Store>
__device__ __forceinline__ void reduce_thread_per_output(long long n_out, long long R, Base base, Off off, Load load,
                                                         Store store) {
  for (long long o = threadIdx.x; o < n_out; o += LATCH_THREADS) {
    const long long b = base(o);
    Acc acc = Op::template init<Acc>();
    for (long long r = 0; r < R; ++r) acc = Op::apply(acc, load(b + off(r)));
    store(o, acc);
  }
}

template <class Acc, class Op, class Base, class Off, class Load, class Store>
__device__ __forceinline__ void reduce_block_per_output(long long n_out, long long R, Base base, Off off, Load load,
                                                        Store store, Acc* scratch) {
  for (long long o = 0; o < n_out; ++o) {
    const long long b = base(o);
    Acc acc = Op::template init<Acc>();
    for (long long r = threadIdx.x; r < R; r += LATCH_THREADS) acc = Op::apply(acc, load(b + off(r)));
    acc = block_reduce<Op>(acc, scratch);
    if (threadIdx.x == 0) store(o, acc);
  }
}

// Row reductions over contiguous memory, four elements per access: ``load4(i, v)`` fills v[0..3]
// with the input elements at offsets i..i+3 (i a multiple of 4 from an aligned row start: the caller
// checks R % 4 == 0 and the operands' alignment). Each thread keeps four accumulators (one per
// element of the access) combined in a fixed order, then the warp (or block) combines in a fixed
// order: the same bits on every run, and four independent loads per iteration in flight.
template <class Acc, class Op, class Base, class Load4, class Store>
__device__ __forceinline__ void reduce_rows_vec4_warp(long long n_out, long long R, Base base, Load4 load4,
                                                      Store store) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = LATCH_THREADS >> 5;
  for (long long o = warp; o < n_out; o += nw) {
    const long long b = base(o);
    Acc a[4] = {Op::template init<Acc>(), Op::template init<Acc>(), Op::template init<Acc>(), Op::template init<Acc>()};
#pragma unroll 4
    for (long long r = 4 * lane; r < R; r += 128) {
      Acc v[4];
      load4(b + r, v);
#pragma unroll
      for (int j = 0; j < 4; ++j) a[j] = Op::apply(a[j], v[j]);
    }
    Acc acc = Op::apply(Op::apply(a[0], a[1]), Op::apply(a[2], a[3]));
    acc = warp_reduce<Op>(acc);
    if (lane == 0) store(o, acc);
  }
}

// The block form (long rows: a full reduction's second level over its partials) issues
// REDUCE_BLOCK_UNROLL accesses per thread before accumulating them, in the same order as one at a
// time (the same bits), so each thread keeps that many 16-byte loads in flight.
#define REDUCE_BLOCK_UNROLL 8
template <class Acc, class Op, class Base, class Load4, class Store>
__device__ __forceinline__ void reduce_rows_vec4_block(long long n_out, long long R, Base base, Load4 load4,
                                                       Store store, Acc* scratch) {
  constexpr int U = REDUCE_BLOCK_UNROLL;
  constexpr long long S = 4LL * LATCH_THREADS;
  for (long long o = 0; o < n_out; ++o) {
    const long long b = base(o);
    Acc a[4] = {Op::template init<Acc>(), Op::template init<Acc>(), Op::template init<Acc>(), Op::template init<Acc>()};
    long long r = 4 * threadIdx.x;
    for (; r + S * (U - 1) < R; r += S * U) {
      Acc v[U][4];
#pragma unroll
      for (int k = 0; k < U; ++k) load4(b + r + S * k, v[k]);
#pragma unroll
      for (int k = 0; k < U; ++k) {
#pragma unroll
        for (int j = 0; j < 4; ++j) a[j] = Op::apply(a[j], v[k][j]);
      }
    }
    for (; r < R; r += S) {
      Acc v[4];
      load4(b + r, v);
#pragma unroll
      for (int j = 0; j < 4; ++j) a[j] = Op::apply(a[j], v[j]);
    }
    Acc acc = Op::apply(Op::apply(a[0], a[1]), Op::apply(a[2], a[3]));
    acc = block_reduce<Op>(acc, scratch);
    if (threadIdx.x == 0) store(o, acc);
  }
}

struct ProdOp {
  template <class T> __device__ __forceinline__ static T init() { return T(1); }
  template <class T> __device__ __forceinline__ static T apply(T a, T b) { return a * b; }
};

// (value, index) pairs for argmax / argmin: NaN counts as the extreme (as in torch), ties keep the
// first index.
template <bool IsMax> struct ArgBetter {
  __device__ __forceinline__ static bool better(double v, long long i, double w, long long j) {
    const bool vn = v != v, wn = w != w;
    if (vn || wn) return vn && (!wn || i < j);
    if (v == w) return i < j;
    return IsMax ? v > w : v < w;
  }
};

template <bool IsMax, class Base, class Off, class Load, class Store>
__device__ __forceinline__ void argreduce_warp_per_output(long long n_out, long long R, Base base, Off off, Load load,
                                                          Store store) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = LATCH_THREADS >> 5;
  for (long long o = warp; o < n_out; o += nw) {
    const long long b = base(o);
    double best = 0;
    long long bi = -1;
    for (long long r = lane; r < R; r += 32) {
      const double v = load(b + off(r));
      if (bi < 0 || ArgBetter<IsMax>::better(v, r, best, bi)) {
        best = v;
        bi = r;
      }
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
      const double w = __shfl_xor_sync(0xffffffffu, best, s);
      const long long wi = __shfl_xor_sync(0xffffffffu, bi, s);
      if (wi >= 0 && (bi < 0 || ArgBetter<IsMax>::better(w, wi, best, bi))) {
        best = w;
        bi = wi;
      }
    }
    if (lane == 0) store(o, bi);
  }
}

}  // namespace latch

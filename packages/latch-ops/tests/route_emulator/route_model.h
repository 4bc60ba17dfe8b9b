// A CPU model of the few CUDA features latch_route.cuh uses, for the CPU test
// (test_route_emulated.py): the block's 256 consumer threads are fibers on one OS thread
// (attention_emulator/fibers.h: switched only where a thread waits, so a run is deterministic),
// warp collectives (__match_any_sync, __ballot_sync, __shfl_up_sync, __syncwarp) meet at a per-warp barrier and
// exchange values through a per-warp buffer, latch::block_sync is a barrier of all 256, and
// latch_report records the first error. Written from the CUDA programming guide's definitions of
// those intrinsics, independently of the bodies.
#pragma once

#include <algorithm>
#include <cstdint>

#define __device__
#define __forceinline__ inline
#define LATCH_THREADS 256
#define LATCH_EMULATED_ROUTE 1

struct Dim3 { unsigned x; };
extern thread_local Dim3 threadIdx;  // set per fiber by the scheduler

using std::max;
using std::min;

namespace emu {
void warp_barrier();
void block_barrier();
long long* warp_slots();  // this warp's 32 exchange slots
}  // namespace emu

inline void __syncwarp() { emu::warp_barrier(); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
// every lane of the warp takes part (the bodies pass the full mask)
inline unsigned __match_any_sync(unsigned, int v) {
  long long* s = emu::warp_slots();
  const int lane = threadIdx.x & 31;
  s[lane] = v;
  emu::warp_barrier();
  unsigned m = 0;
  for (int l = 0; l < 32; ++l) m |= (s[l] == v ? 1u : 0u) << l;
  emu::warp_barrier();
  return m;
}
inline unsigned __ballot_sync(unsigned, bool v) {
  long long* s = emu::warp_slots();
  const int lane = threadIdx.x & 31;
  s[lane] = v ? 1 : 0;
  emu::warp_barrier();
  unsigned m = 0;
  for (int l = 0; l < 32; ++l) m |= (s[l] ? 1u : 0u) << l;
  emu::warp_barrier();
  return m;
}
inline int __shfl_up_sync(unsigned, int v, int delta) {
  long long* s = emu::warp_slots();
  const int lane = threadIdx.x & 31;
  s[lane] = v;
  emu::warp_barrier();
  const int r = lane >= delta ? (int)s[lane - delta] : v;
  emu::warp_barrier();
  return r;
}
inline int atomicAdd(int* p, int v) {  // fibers never switch inside it: atomic by construction
  const int old = *p;
  *p = old + v;
  return old;
}

extern "C" void latch_report(int code, long long a, long long b);

namespace latch {
enum { ERR_INDEX_RANGE = 4 };  // latch_common.cuh's code
inline void block_sync() { emu::block_barrier(); }
}  // namespace latch

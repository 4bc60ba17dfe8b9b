// Runs latch_route.cuh's route_order bodies on the CPU (route_model.h): 256 fibers, one block.
#include <ucontext.h>

#include <vector>

#include "route_model.h"
#include "latch_route.cuh"

thread_local Dim3 threadIdx;
static long long g_err[3];

extern "C" void latch_report(int code, long long a, long long b) {
  if (g_err[0] == 0) {
    g_err[0] = code;
    g_err[1] = a;
    g_err[2] = b;
  }
}

namespace emu {
constexpr int N = 256;
#include "fibers.h"
static Barrier warp_bar[8] = {{32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}};
static Barrier block_bar{256};
static long long slots[8][32];
void warp_barrier() { wait(warp_bar[threadIdx.x >> 5]); }
void block_barrier() { wait(block_bar); }
long long* warp_slots() { return slots[threadIdx.x >> 5]; }
}  // namespace emu

struct Args {
  int which, k;
  long long n, e;
  const long long* idx;
  long long *token, *position, *offsets;
  int* smem;
};

static void job(void* p) {
  const Args& a = *(const Args*)p;
  if (a.which == 0) latch::route_order_warps<long long, long long>(a.idx, a.token, a.position, a.offsets, a.n, a.k, a.e, a.smem);
  else latch::route_order_all<long long, long long>(a.idx, a.token, a.position, a.offsets, a.n, a.k, a.e, a.smem);
}

// which: 0 route_order_warps (smem (256 / 32) * (E + 1) ints, lower_moe._route_smem), 1 route_order_all
// (E + 256 ints). err[3]: the first latch_report (code, a, b), zeros when none. Returns 0.
extern "C" int route_emulated(int which, long long n, int k, long long e, const long long* idx, long long* token,
                              long long* position, long long* offsets, long long* err) {
  const long long ints = which == 0 ? 8 * (e + 1) : e + 256;
  std::vector<int> smem((size_t)ints + 64, 0x5a5a5a5a);  // poisoned past what the body may use: see the guard
  const int guard = 0x5a5a5a5a;
  g_err[0] = g_err[1] = g_err[2] = 0;
  Args a{which, k, n, e, idx, token, position, offsets, smem.data()};
  emu::run_block(job, &a);
  for (int i = 0; i < 3; ++i) err[i] = g_err[i];
  for (size_t i = (size_t)ints; i < smem.size(); ++i)
    if (smem[i] != guard) return 3;  // the body wrote past its shared memory
  return 0;
}

// The split route_order (route_count, route_place, route_rows, route_offsets), each task a block run
// of its own in task order: chunks of `chunk` pairs, row tiles of `rows` rows. counts: C * E int32
// (poisoned by the caller), the other outputs as route_emulated's, pairs[N * k]. Returns 0, or 3 when
// a body wrote past its shared memory ((C + 1) * E + E + 1 + 256 + 8 * E ints at most: route_place).
struct SplitArgs {
  int step, k;
  long long n, e, chunk, c, lo, hi;
  const long long* idx;
  int* counts;
  long long *token, *position, *pairs, *offsets;
  int* smem;
};

static void split_job(void* p) {
  const SplitArgs& a = *(const SplitArgs*)p;
  const long long P = a.n * a.k;
  if (a.step == 0) latch::route_count<long long, int>(a.idx, a.counts + a.lo / a.chunk * a.e, a.lo, a.hi, a.e, a.smem);
  else if (a.step == 1)
    latch::route_place<long long, int, long long>(a.idx, a.counts, a.position, P, a.chunk, a.c, a.e, a.lo, a.hi, a.smem);
  else if (a.step == 2)
    latch::route_rows<long long, int, long long>(a.idx, a.counts, a.token, a.pairs, P, a.k, a.chunk, a.c, a.e, a.lo, a.hi,
                                                 a.smem);
  else latch::route_offsets<int, long long>(a.counts, a.offsets, a.c, a.e, a.smem);
}

extern "C" int route_split_emulated(long long n, int k, long long e, long long chunk, long long rows, const long long* idx,
                                    int* counts, long long* token, long long* position, long long* pairs,
                                    long long* offsets, long long* err) {
  const long long P = n * k, C = (P + chunk - 1) / chunk;
  const long long ints = (C + 1) * e + e + 1 + 256 + 8 * e;  // route_place's, the most of the four
  std::vector<int> smem((size_t)ints + 64, 0x5a5a5a5a);
  const int guard = 0x5a5a5a5a;
  g_err[0] = g_err[1] = g_err[2] = 0;
  auto run = [&](int step, long long lo, long long hi) {
    SplitArgs a{step, k, n, e, chunk, C, lo, hi, idx, counts, token, position, pairs, offsets, smem.data()};
    emu::run_block(split_job, &a);
  };
  for (long long c = 0; c < C; ++c) run(0, c * chunk, std::min(P, (c + 1) * chunk));
  for (long long c = 0; c < C; ++c) run(1, c, c + 1);  // route_place's tile: whole chunks
  for (long long r = 0; r < P; r += rows) run(2, r, std::min(P, r + rows));
  run(3, 0, 0);
  for (int i = 0; i < 3; ++i) err[i] = g_err[i];
  for (size_t i = (size_t)ints; i < smem.size(); ++i)
    if (smem[i] != guard) return 3;
  return 0;
}

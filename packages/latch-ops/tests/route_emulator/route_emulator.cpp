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

// Runs latch_attention_wgmma.cuh's forward on the CPU (see wgmma_model.h): 257 fibers, the
// producer thread (index 256) and the 256 consumer threads, switched only where a thread waits, over
// a ring of ``stages`` 32 KiB stages. Tasks are boxes of (batch, heads, query rows) given by the
// test; both roles walk them in order, each keeping its own ring position, as in the worker.
#include <ucontext.h>

#include <cstdlib>
#include <map>
#include <vector>

#include "wgmma_model.h"
#include "latch_attention_wgmma.cuh"

thread_local Dim3 threadIdx;

namespace emu {
constexpr int N = 257, PRODUCER = 256;
char* smem_base;
int failed;
#include "fibers.h"
static Barrier warp_bar[9] = {{32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}};
static Barrier wg_bar[2] = {{128}, {128}};
static float fbuf[9][32];
static uint32_t abuf[9][32 * 4], bbuf[9][32 * 2];
static uint32_t wg_a[2][128][4];
static float* wg_d[2][128];
static std::map<uint64_t*, Mbar> bars;

void block_barrier() { failed = 3; }  // the wgmma forward never synchronises all consumers
void warp_barrier() { wait(warp_bar[threadIdx.x >> 5]); }
void wg_barrier() { wait(wg_bar[threadIdx.x >> 7]); }
float* warp_fbuf() { return fbuf[threadIdx.x >> 5]; }
uint32_t* warp_abuf() { return abuf[threadIdx.x >> 5]; }
uint32_t* warp_bbuf() { return bbuf[threadIdx.x >> 5]; }
Mbar& mbar(uint64_t* bar) { return bars[bar]; }

static float bf(uint16_t x) { return __bfloat162float(__nv_bfloat16{x}); }

// Named barriers: 2 + w over warpgroup w's 128 threads; 1 over all 256 consumers only where the
// body may use it (``allow_block``: the backward; the forward never synchronises both warpgroups).
static Barrier all_bar{256};
bool allow_block;
static Barrier* named(int id, int threads, int& slot) {
  const int wg = threadIdx.x >> 7;
  if (threads == 128 && id == 2 + wg) {
    slot = wg;
    return &wg_bar[wg];
  }
  if (allow_block && threads == 256 && id == 1) {
    slot = 2;
    return &all_bar;
  }
  failed = 5;
  return nullptr;
}
void named_sync(int id, int threads) {
  int slot;
  if (Barrier* b = named(id, threads, slot)) wait(*b);
}

static int bar_or[3][2];  // per barrier, two generations: the OR being gathered and the last one
bool named_sync_or(int id, int threads, bool pred) {
  int slot;
  Barrier* b = named(id, threads, slot);
  if (!b) return true;
  const long gen = b->gen;
  bar_or[slot][gen & 1] |= pred ? 1 : 0;
  wait(*b);
  const bool r = bar_or[slot][gen & 1] != 0;
  wait(*b);  // everyone read it: clear for the next use of this generation slot
  if ((threadIdx.x & (threads - 1)) == 0) bar_or[slot][gen & 1] = 0;
  wait(*b);
  return r;
}

struct Desc {
  uint32_t start, lbo, sbo;
};
static Desc decode(uint64_t desc) {
  if ((desc >> 62) != 1) failed = 4;  // 128-byte swizzle
  return {(uint32_t)(desc & 0x3FFF) << 4, (uint32_t)((desc >> 16) & 0x3FFF) << 4, (uint32_t)((desc >> 32) & 0x3FFF) << 4};
}
static float smem_bf(uint32_t logical) {
  uint16_t x;
  std::memcpy(&x, smem_base + latch::awg::swizzle128(logical), 2);
  return bf(x);
}
// K-major (rows are M or N, 8-row groups SBO apart, K along the 128-byte row); N-major (rows are K,
// 8-row groups SBO apart, 64-column blocks of N LBO apart)
static uint32_t kmajor(const Desc& d, int row, int k) { return d.start + (row / 8) * d.sbo + (row % 8) * 128 + 2 * k; }
static uint32_t nmajor(const Desc& d, int k, int col) {
  return d.start + (col / 64) * d.lbo + (k / 8) * d.sbo + (k % 8) * 128 + 2 * (col % 64);
}

// D (64 x n, FP32) = A (64 x 16) B (16 x n, shared memory) [+ D] for the caller's warpgroup; A from
// the threads' register fragments (``adesc`` = 0) or from shared memory (K-major)
static void wgmma(float* d, int n, const uint32_t* a, uint64_t adesc, uint64_t bdesc, int scale_d, int tb) {
  const int wg = threadIdx.x >> 7, lt = threadIdx.x & 127;
  if (a)
    for (int i = 0; i < 4; ++i) wg_a[wg][lt][i] = a[i];
  wg_d[wg][lt] = d;
  wg_barrier();
  if (lt == 0) {
    static float A[64][16], B[16][256];
    if (a) {
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 16; ++k) {
          // thread 32 (m / 16) + 4 (m % 8) + (k % 8) / 2, register (m % 16 >= 8) + 2 (k >= 8), half k % 2
          const uint32_t r = wg_a[wg][32 * (m / 16) + 4 * (m % 8) + (k % 8) / 2][(m % 16 >= 8) + 2 * (k >= 8)];
          A[m][k] = bf((uint16_t)(k % 2 ? r >> 16 : r & 0xffffu));
        }
    } else {
      const Desc da = decode(adesc);
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 16; ++k) A[m][k] = smem_bf(kmajor(da, m, k));
    }
    const Desc db = decode(bdesc);
    for (int k = 0; k < 16; ++k)
      for (int c = 0; c < n; ++c) B[k][c] = smem_bf(tb == 0 ? kmajor(db, c, k) : nmajor(db, k, c));
    for (int m = 0; m < 64; ++m)
      for (int c = 0; c < n; ++c) {
        float acc = 0.f;
        for (int k = 0; k < 16; ++k) acc += A[m][k] * B[k][c];
        // thread 32 (m / 16) + 4 (m % 8) + (c % 8) / 2 holds it at 4 (c / 8) + 2 (m % 16 >= 8) + c % 2
        float& dst = wg_d[wg][32 * (m / 16) + 4 * (m % 8) + (c % 8) / 2][4 * (c / 8) + 2 * (m % 16 >= 8) + c % 2];
        dst = (scale_d ? dst : 0.f) + acc;
      }
  }
  wg_barrier();
}
// The asynchronous side: per thread, the products issued and not yet run, in issue order, each with
// its group (groups[i] < open: committed). Every thread of a warpgroup issues, commits and waits at
// the same points, so the collective wgmma() above runs the same product on all 128 at once.
struct Pending {
  float* d;
  int n;
  const uint32_t* a;  // read when the product runs (a fragment rewritten before the wait is a bug)
  uint64_t adesc, bdesc;
  int scale_d, tb;
  long group;
};
static std::vector<Pending> pending[N];
static long open_group[N];
void wgmma_rs(float* d, int n, const uint32_t* a, uint64_t desc, int scale_d, int tb) {
  pending[threadIdx.x].push_back({d, n, a, 0, desc, scale_d, tb, open_group[threadIdx.x]});
}
void wgmma_ss(float* d, int n, uint64_t adesc, uint64_t bdesc, int scale_d) {
  pending[threadIdx.x].push_back({d, n, nullptr, adesc, bdesc, scale_d, 0, open_group[threadIdx.x]});
}
void wgmma_commit() { ++open_group[threadIdx.x]; }
#ifndef LATCH_EMU_WAIT_SLACK
#define LATCH_EMU_WAIT_SLACK 0  // the model's own test: a wait<N > 0> that leaves one more group in flight
#endif
void wgmma_wait(int groups) {
  if (groups > 0) groups += LATCH_EMU_WAIT_SLACK;
  std::vector<Pending>& q = pending[threadIdx.x];
  const long keep_from = open_group[threadIdx.x] - groups;  // groups >= this one may stay in flight
  size_t i = 0;
  for (; i < q.size() && q[i].group < keep_from; ++i) wgmma(q[i].d, q[i].n, q[i].a, q[i].adesc, q[i].bdesc, q[i].scale_d, q[i].tb);
  q.erase(q.begin(), q.begin() + i);
}
int wgmma_pending() { return (int)pending[threadIdx.x].size(); }
void reset_wgmma() {
  for (int i = 0; i < N; ++i) {
    pending[i].clear();
    open_group[i] = 0;
  }
}

}  // namespace emu

struct Args {
  int D, causal, H, Hkv, Tq, Tk, ntasks;
  float scale;
  const int* boxes;  // per task: b0, b1, h0, h1, r0, r1
  latch::awg::EmuMap mq, mk, mv;
  __nv_bfloat16* out;
  float* lse;
  latch::Pipe pipe;
  char* scratch;
};

template <int D, bool C>
static void fwd_all(const Args& a) {
  latch::Pipe p = a.pipe;  // this thread's ring position, carried from task to task
  for (int i = 0; i < a.ntasks; ++i) {
    latch::Task t{};
    const int* bx = a.boxes + 6 * i;
    for (int d = 0; d < 3; ++d) {
      t.lo[d] = bx[2 * d];
      t.hi[d] = bx[2 * d + 1];
    }
    if (threadIdx.x == emu::PRODUCER) {
      if (!latch::awg::fwd_produce<D, C>(p, &t, &a.mq, &a.mk, &a.mv, a.H, a.Hkv, a.Tq, a.Tk)) return;
    } else {
      if (!latch::awg::fwd_consume<D, C>(p, &t, a.out, a.lse, a.H, a.Tq, a.Tk, a.scale, a.scratch)) return;
      if (emu::wgmma_pending()) emu::failed = 6;  // a task ended with products never waited for
    }
  }
}

static void fwd_job(void* p) {
  const Args& a = *(const Args*)p;
  if (a.D == 64) a.causal ? fwd_all<64, true>(a) : fwd_all<64, false>(a);
  else a.causal ? fwd_all<128, true>(a) : fwd_all<128, false>(a);
}

// Returns 0, or the model's failure code (1: a wait gave up, 2: a TMA box the hardware refuses,
// 3: a block-wide barrier, 4: a descriptor without the 128-byte swizzle, 5: a named barrier other
// than the warpgroup's own, 6: a task that ends with wgmma products never waited for), 9: a bad argument.
extern "C" int attn_forward_wgmma(int D, int causal, int B, int H, int Hkv, int Tq, int Tk, float scale, int stages,
                                  int ntasks, const int* boxes, const void* q, const void* k, const void* v, void* out,
                                  float* lse) {
  if ((D != 64 && D != 128) || stages < 2) return 9;
  const int stage_bytes = 32768;
  const size_t bytes = (size_t)stages * stage_bytes + 128 * D * 2;  // the ring, then the body's scratch (Q)
  void* mem = std::aligned_alloc(1024, bytes);
  std::memset(mem, 0x7f, bytes);  // poisoned: a stage read before it is filled shows
  emu::smem_base = (char*)mem;
  emu::failed = 0;
  emu::allow_block = false;
  emu::reset_wgmma();
  emu::bars.clear();
  std::vector<uint64_t> full(stages), empty(stages);
  for (int s = 0; s < stages; ++s) {
    emu::mbar(&full[s]).count = 1;
    emu::mbar(&empty[s]).count = 8;  // one arrival per consumer warp
  }
  const int bn = D == 64 ? latch::awg::FwdShape<64>::BN : latch::awg::FwdShape<128>::BN;
  Args a{D, causal, H, Hkv, Tq, Tk, ntasks, scale, boxes,
         {(const __nv_bfloat16*)q, {D, Tq, B * H}, {64, 128, 1}},
         {(const __nv_bfloat16*)k, {D, Tk, B * Hkv}, {64, bn, 1}},
         {(const __nv_bfloat16*)v, {D, Tk, B * Hkv}, {64, bn, 1}},
         (__nv_bfloat16*)out, lse,
         latch::Pipe{(char*)mem, full.data(), empty.data(), stages, stage_bytes, 0, 0},
         (char*)mem + (size_t)stages * stage_bytes};
  emu::run_block(fwd_job, &a);
  std::free(mem);
  return emu::failed;
}

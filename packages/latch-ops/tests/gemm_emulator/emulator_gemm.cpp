// Runs latch_gemm.cuh's cooperative body and latch_gemm_pingpong.cuh's ping-pong body on the CPU
// (see gemm_model.h): 257 fibers, the producer thread (index 256) and the 256 consumer threads,
// switched only where a thread waits, over a ring of ``stages`` stages. Tasks are output boxes
// given by the test, in order; as in the worker (latch_kernel_main.cuh) the producer fills the
// ring across task boundaries, each task's consumers start at the ring position the producer had
// when it began that task, and all 256 consumers meet at a barrier after every body. After each
// task every consumer thread's ``Ctx::async_stores`` is recorded: the worker needs it uniform.
#include <ucontext.h>

#include <cstdlib>
#include <map>
#include <vector>

#include "gemm_model.h"
#include "latch_gemm.cuh"
#include "latch_gemm_pingpong.cuh"

thread_local Dim3 threadIdx;

namespace emu {
constexpr int N = 257, PRODUCER = 256;
char* smem_base;
int failed;
#include "fibers.h"
static Barrier warp_bar[9] = {{32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}};
static Barrier wg_bar[2] = {{128}, {128}};
static Barrier block_bar{256};
static float* wg_d[2][128];
static std::map<uint64_t*, Mbar> bars;

static void wait_or_fail(Barrier& b) {  // a barrier that lets everyone go once the run failed
  const long gen = b.gen;
  if (++b.count == b.size) {
    b.count = 0;
    ++b.gen;
    return;
  }
  while (b.gen == gen && !failed) yield_now();
}
void block_barrier() { wait_or_fail(block_bar); }
void warp_barrier() { wait_or_fail(warp_bar[threadIdx.x >> 5]); }
static float fbuf[9][32];
static uint32_t abuf[9][32 * 4], bbuf[9][32 * 2];
float* warp_fbuf() { return fbuf[threadIdx.x >> 5]; }
uint32_t* warp_abuf() { return abuf[threadIdx.x >> 5]; }
uint32_t* warp_bbuf() { return bbuf[threadIdx.x >> 5]; }
Mbar& mbar(uint64_t* bar) { return bars[bar]; }

// Named barriers 14 and 15 over 256 threads (the ping-pong turns): complete once 256 threads
// arrived or synced; bar.sync waits for the completion, bar.arrive does not.
static Barrier turn_bar[2] = {{256}, {256}};
static Barrier* turn(int id, int threads) {
  if (threads != 256 || (id != 14 && id != 15)) {
    failed = 5;
    return nullptr;
  }
  return &turn_bar[id - 14];
}
void named_arrive(int id, int threads) {
  Barrier* b = turn(id, threads);
  if (b && ++b->count == b->size) {
    b->count = 0;
    ++b->gen;
  }
}
void named_sync(int id, int threads) {
  if (Barrier* b = turn(id, threads)) wait_or_fail(*b);
}

static float bf(uint16_t x) { return __bfloat162float(__nv_bfloat16{x}); }
struct Desc {
  uint32_t start, lbo, sbo;
};
static Desc decode(uint64_t desc) {
  if ((desc >> 62) != 1) failed = 4;  // 128-byte swizzle
  return {(uint32_t)(desc & 0x3FFF) << 4, (uint32_t)((desc >> 16) & 0x3FFF) << 4, (uint32_t)((desc >> 32) & 0x3FFF) << 4};
}
static float smem_bf(uint32_t logical) {
  uint16_t x;
  std::memcpy(&x, smem_base + swizzle128(logical), 2);
  return bf(x);
}
// K-major: rows (M or N) in 8-row groups SBO apart, K along the 128-byte row. MN-major: rows are K
// in 8-row groups SBO apart, 64-element blocks of M or N LBO apart.
static uint32_t kmajor(const Desc& d, int row, int k) { return d.start + (row / 8) * d.sbo + (row % 8) * 128 + 2 * k; }
static uint32_t mnmajor(const Desc& d, int k, int col) {
  return d.start + (col / 64) * d.lbo + (k / 8) * d.sbo + (k % 8) * 128 + 2 * (col % 64);
}

// D (64 x n, FP32) = A (64 x 16) B (16 x n) [+ D] for the caller's warpgroup, both from shared memory
void wgmma(float* d, int n, uint64_t adesc, uint64_t bdesc, int scale_d, int ta, int tb) {
  const int wg = threadIdx.x >> 7, lt = threadIdx.x & 127;
  wg_d[wg][lt] = d;
  wait_or_fail(wg_bar[wg]);
  if (lt == 0) {
    static float A[64][16], B[16][256];
    const Desc da = decode(adesc), db = decode(bdesc);
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < 16; ++k) A[m][k] = smem_bf(ta == 0 ? kmajor(da, m, k) : mnmajor(da, k, m));
    for (int k = 0; k < 16; ++k)
      for (int c = 0; c < n; ++c) B[k][c] = smem_bf(tb == 0 ? kmajor(db, c, k) : mnmajor(db, k, c));
    for (int m = 0; m < 64; ++m)
      for (int c = 0; c < n; ++c) {
        float acc = 0.f;
        for (int k = 0; k < 16; ++k) acc += A[m][k] * B[k][c];
        // thread 32 (m / 16) + 4 (m % 8) + (c % 8) / 2 holds it at 4 (c / 8) + 2 (m % 16 >= 8) + c % 2
        float& dst = wg_d[wg][32 * (m / 16) + 4 * (m % 8) + (c % 8) / 2][4 * (c / 8) + 2 * (m % 16 >= 8) + c % 2];
        dst = (scale_d ? dst : 0.f) + acc;
      }
  }
  wait_or_fail(wg_bar[wg]);
}
}  // namespace emu

struct Args {
  int M, N, K, ntasks, stages, nk;
  const int* boxes;  // per task: m_lo, m_hi, n_lo, n_hi
  const long long* start;  // per task: the ring position (in stages) of its first stage
  latch::sm90::EmuMap ma, mb, mc;
  void* c;
  latch::Pipe pipe;
  char* scratch;
  int* async;  // [ntasks][256]
};

template <class TC, bool TMA, bool PP, int BN, bool A_MN, bool B_K>
static void run_all(const Args& a) {
  constexpr int SUB = PP ? latch::GEMM_PP_BN : BN;
  latch::Pipe p = a.pipe;
  const int tid = threadIdx.x;
  for (int i = 0; i < a.ntasks; ++i) {
    const int* bx = a.boxes + 4 * i;
    if (tid == emu::PRODUCER) {  // it runs ahead, across tasks
      if (!latch::gemm_produce<128, SUB, A_MN, B_K>(p, &a.ma, &a.mb, bx[0], bx[1], bx[2], bx[3], 0, a.K)) return;
      continue;
    }
    p.stage = (uint32_t)(a.start[i] % a.stages);  // the worker's Slot::ring
    p.phase = (uint32_t)((a.start[i] / a.stages) & 1);
    int async_stores = 0;
    latch::GemmStore<TC> regs{(TC*)a.c, (long long)a.N, bx[1], bx[3], (a.N & 1) == 0};
    bool ok;
    if constexpr (TMA) {
      latch::GemmStoreTma<TC, 2> epi{regs, &a.mc, a.scratch, a.M, a.N, &async_stores};
      ok = PP ? latch::gemm_pp_consume<__nv_bfloat16, A_MN, B_K>(p, epi, bx[0], bx[1], bx[2], bx[3], 0, a.K)
              : latch::gemm_consume<__nv_bfloat16, 128, BN, A_MN, B_K>(p, epi, bx[0], bx[1], bx[2], bx[3], 0, a.K);
    } else {
      ok = PP ? latch::gemm_pp_consume<__nv_bfloat16, A_MN, B_K>(p, regs, bx[0], bx[1], bx[2], bx[3], 0, a.K)
              : latch::gemm_consume<__nv_bfloat16, 128, BN, A_MN, B_K>(p, regs, bx[0], bx[1], bx[2], bx[3], 0, a.K);
    }
    if (!ok) return;
    a.async[256 * i + tid] = async_stores;
    emu::block_barrier();  // the worker's barrier of all consumers after a body
  }
}

template <class TC, bool TMA, bool PP, int BN>
static void layout_job(const Args& a, int ta, int tb) {
  if (!ta && tb) run_all<TC, TMA, PP, BN, false, true>(a);  // a forward: b stored [N, K]
  else if (!ta && !tb) run_all<TC, TMA, PP, BN, false, false>(a);  // an input gradient
  else if (ta && !tb) run_all<TC, TMA, PP, BN, true, false>(a);  // a weight gradient: a stored [K, M]
  else emu::failed = 9;
}

static int g_f32, g_tma, g_pp, g_ta, g_tb;
static void job(void* p) {
  const Args& a = *(const Args*)p;
  if (g_f32) {
    if (g_tma) g_pp ? layout_job<float, true, true, 256>(a, g_ta, g_tb) : layout_job<float, true, false, 256>(a, g_ta, g_tb);
    else g_pp ? layout_job<float, false, true, 256>(a, g_ta, g_tb) : layout_job<float, false, false, 256>(a, g_ta, g_tb);
  } else {
    if (g_tma) g_pp ? layout_job<__nv_bfloat16, true, true, 256>(a, g_ta, g_tb)
                    : layout_job<__nv_bfloat16, true, false, 256>(a, g_ta, g_tb);
    else g_pp ? layout_job<__nv_bfloat16, false, true, 256>(a, g_ta, g_tb)
              : layout_job<__nv_bfloat16, false, false, 256>(a, g_ta, g_tb);
  }
}

// out[M, N] = A B with a stored [K, M] when ``ta`` (else [M, K]), b stored [N, K] when ``tb``
// (else [K, N]): the node's trans_a / trans_b (A_MN = ta, B_K = tb); ``pp``: the ping-pong body (sub-tiles of
// 128 x 128), else the cooperative one with BN = 256; ``tma``: GemmStoreTma, else GemmStore.
// Returns 0, or the model's failure code (1: a wait gave up, 2: a TMA box the hardware refuses,
// 4: a descriptor without the 128-byte swizzle, 6: an mbarrier over-arrived, 9: a bad argument).
// ``empty_count``: the arrivals a stage's empty barrier expects (the worker's: 8, one per consumer warp).
extern "C" int gemm_emulated(int M, int N, int K, int ta, int tb, int pp, int tma, int f32, int stages, int ntasks,
                             const int* boxes, const void* a, const void* b, void* c, int* async, int empty_count) {
  if (stages < 2 || K < 0) return 9;
  const int sub = pp ? 128 : 256;
  const int stage_bytes = (128 + sub) * 64 * 2;
  const int nk = (K + 63) / 64;
  std::vector<long long> start(ntasks);
  long long pos = 0;
  for (int i = 0; i < ntasks; ++i) {
    start[i] = pos;
    const int* bx = boxes + 4 * i;
    pos += (long long)((bx[1] - bx[0] + 127) / 128) * ((bx[3] - bx[2] + sub - 1) / sub) * nk;
  }
  const size_t scratch = latch::gemm_tma_store_smem(2);
  const size_t bytes = (size_t)stages * stage_bytes + scratch;
  void* mem = std::aligned_alloc(1024, bytes);
  std::memset(mem, 0x7f, bytes);  // poisoned: a stage read before it is filled shows
  emu::smem_base = (char*)mem;
  emu::failed = 0;
  emu::bars.clear();
  // (a failed run leaves fibers mid-barrier: start every barrier afresh)
  for (auto& b : emu::warp_bar) b.count = 0;
  for (auto& b : emu::wg_bar) b.count = 0;
  for (auto& b : emu::turn_bar) b.count = 0;
  emu::block_bar.count = 0;
  std::vector<uint64_t> full(stages), empty(stages);
  for (int s = 0; s < stages; ++s) {
    emu::mbar(&full[s]).count = 1;
    emu::mbar(&empty[s]).count = empty_count;
  }
  g_f32 = f32;
  g_tma = tma;
  g_pp = pp;
  g_ta = ta;
  g_tb = tb;
  const int es = f32 ? 4 : 2;
  // the lowering's maps (lower_matmul._tensor_maps): a [M, K]: box 64 K x 128 rows; [K, M]: 64 M x 64 K;
  // b [N, K]: 64 K x BN rows; [K, N]: 64 N x 64 K; the output: one 128-byte row x 8 rows
  latch::sm90::EmuMap ma = ta ? latch::sm90::EmuMap{(char*)a, 2, {M, K}, {64, 64}} : latch::sm90::EmuMap{(char*)a, 2, {K, M}, {64, 128}};
  latch::sm90::EmuMap mb = tb ? latch::sm90::EmuMap{(char*)b, 2, {K, N}, {64, sub}} : latch::sm90::EmuMap{(char*)b, 2, {N, K}, {64, 64}};
  latch::sm90::EmuMap mc{(char*)c, es, {N, M}, {128 / es, 8}};
  Args args{M, N, K, ntasks, stages, nk, boxes, start.data(), ma, mb, mc, c,
            latch::Pipe{(char*)mem, full.data(), empty.data(), stages, stage_bytes, 0, 0},
            (char*)mem + (size_t)stages * stage_bytes, async};
  emu::run_block(job, &args);
  std::free(mem);
  return emu::failed;
}

// A CPU model of what latch_attention_wgmma.cuh uses from the worker and the hardware, for the CPU
// test (test_attention_wgmma_emulated.py): the producer thread and the 256 consumer threads are
// fibers (emulator_wgmma.cpp), mbarriers count arrivals and transaction bytes and complete phases,
// a TMA load writes its 3-D box at once (zeros outside the tensor) with the 128-byte swizzle, and a
// register-A wgmma is a warpgroup-collective product that reads B through its shared-memory
// descriptor. Layouts follow the PTX ISA ("Matrix Descriptor Format", "Register Fragments and
// Shared Memory Matrix Layouts" of wgmma) and latch_sm90.cuh's descriptor comment, written here
// independently of the body. The model checks indexing, masking, the softmax, and the order in which
// the two roles fill and release the ring's stages. A wgmma is asynchronous as on the hardware: issuing
// it only records it; wgmma_commit closes a group, and wgmma_wait<N> runs the oldest committed groups
// until N are left, each product reading its register fragments, its shared memory and its
// accumulators THEN (so a body that reads an accumulator before its wait, rewrites a fragment or
// releases a stage still being read gets wrong numbers, which the FP64 gates catch).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "latch_common.cuh"  // the mma model: bfloat16, threadIdx, warp shuffles

#define LATCH_EMULATED_WGMMA 1
#define __syncwarp() emu::warp_barrier()

namespace emu {
extern char* smem_base;  // the emulated shared memory (1024-byte aligned): smem_addr is an offset in it
extern int failed;       // a wait gave up (a stage that never completes: the roles disagree)
void yield_now();
void wg_barrier();  // the 128 threads of the caller's warpgroup
void wgmma_rs(float* d, int n, const uint32_t* a, uint64_t desc, int scale_d, int tb);
void wgmma_ss(float* d, int n, uint64_t adesc, uint64_t bdesc, int scale_d);
void wgmma_commit();          // closes the caller's open group
void wgmma_wait(int groups);  // runs the caller's oldest committed groups until ``groups`` are left
int wgmma_pending();          // products the caller issued and has not waited for
void reset_wgmma();           // no product in flight (a new run)
void named_sync(int id, int threads);
bool named_sync_or(int id, int threads, bool pred);
struct Mbar {
  long phase = 0;  // completed phases
  int arrivals = 0, count = 1;
  long tx = 0;
};
Mbar& mbar(uint64_t* bar);
}  // namespace emu

inline float fmaxf_(float a, float b) { return a > b ? a : b; }

namespace latch {

struct Task {
  int32_t body, task, group, ndim, op_begin, op_count, tmap, dep;
  int32_t lo[8], hi[8];
};

struct Pipe {
  char* ring;
  uint64_t* full;
  uint64_t* empty;
  int stages, stage_bytes;
  uint32_t stage, phase;
  void advance() {
    if (++stage == (uint32_t)stages) {
      stage = 0;
      phase ^= 1u;
    }
  }
  char* at(uint32_t s) const { return ring + (size_t)s * stage_bytes; }
};

inline bool mbar_done(uint64_t* bar, uint32_t parity) { return (uint32_t)(emu::mbar(bar).phase & 1) != parity; }

inline bool pipe_wait(uint64_t* bar, uint32_t parity, const Pipe&) {
  for (long n = 0; !mbar_done(bar, parity); ++n) {
    if (n > 2000000 || emu::failed) {
      emu::failed = 1;
      return false;
    }
    emu::yield_now();
  }
  return true;
}
inline bool pipe_wait_warp(uint64_t* bar, uint32_t parity, const Pipe& p) { return pipe_wait(bar, parity, p); }

namespace sm90 {
inline uint32_t smem_addr(const void* p) { return (uint32_t)((const char*)p - emu::smem_base); }
inline void mbar_check(emu::Mbar& m) {
  if (m.arrivals == m.count && m.tx == 0) {
    ++m.phase;
    m.arrivals = 0;
  }
}
inline void mbar_arrive(uint64_t* bar) {
  emu::Mbar& m = emu::mbar(bar);
  ++m.arrivals;
  mbar_check(m);
}
inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  emu::Mbar& m = emu::mbar(bar);
  m.tx += bytes;
  ++m.arrivals;
  mbar_check(m);
}
inline void complete_tx(uint64_t* bar, uint32_t bytes) {
  emu::Mbar& m = emu::mbar(bar);
  m.tx -= bytes;
  mbar_check(m);
}
// the same encoding as latch_sm90.cuh (start, LBO, SBO >> 4; 128-byte swizzle)
inline uint64_t wgmma_desc(const void* smem, uint32_t lbo, uint32_t sbo) {
  const uint64_t a = smem_addr(smem);
  return ((a & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) | ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) |
         (1ull << 62);
}
inline void wgmma_fence() {}
inline void fence_proxy_async_shared() {}
inline void named_sync(int id, int threads) { emu::named_sync(id, threads); }
inline bool named_sync_or(int id, int threads, bool pred) { return emu::named_sync_or(id, threads, pred); }
inline void wgmma_commit() { emu::wgmma_commit(); }
template <int N> inline void wgmma_wait() { emu::wgmma_wait(N); }
template <int TA, int TB> inline void wgmma_bf16_m64n64k16(float (&d)[32], uint64_t da, uint64_t db, int s) {
  static_assert(TA == 0 && TB == 0, "the model reads K-major A and B");
  emu::wgmma_ss(d, 64, da, db, s);
}
template <int TA, int TB> inline void wgmma_bf16_m64n128k16(float (&d)[64], uint64_t da, uint64_t db, int s) {
  static_assert(TA == 0 && TB == 0, "the model reads K-major A and B");
  emu::wgmma_ss(d, 128, da, db, s);
}
template <int TB> inline void wgmma_bf16_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int s) {
  emu::wgmma_rs(d, 64, a, db, s, TB);
}
template <int TB> inline void wgmma_bf16_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int s) {
  emu::wgmma_rs(d, 128, a, db, s, TB);
}
}  // namespace sm90

namespace awg {
// A tensor map in the model: a row-major BF16 tensor of dims (innermost first) and its box.
struct EmuMap {
  const __nv_bfloat16* base;
  int dims[3];
  int box[3];
};
inline uint32_t swizzle128(uint32_t logical) { return logical ^ (((logical >> 7) & 7u) << 4); }
inline void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
  const EmuMap& m = *(const EmuMap*)map;
  const uint32_t base = sm90::smem_addr(dst);
  if (base % 1024 || m.box[0] * 2 != 128 || m.box[2] != 1) emu::failed = 2;  // what the body must respect
  for (int r = 0; r < m.box[1]; ++r)
    for (int c = 0; c < m.box[0]; ++c) {
      const long long i0 = c0 + c, i1 = c1 + r, i2 = c2;
      __nv_bfloat16 v{0};
      if (i0 < m.dims[0] && i1 < m.dims[1] && i2 < m.dims[2]) v = m.base[(i2 * m.dims[1] + i1) * m.dims[0] + i0];
      std::memcpy(emu::smem_base + swizzle128(base + 128 * r + 2 * c), &v, 2);
    }
  sm90::complete_tx(bar, (uint32_t)(m.box[0] * m.box[1] * 2));
}
// A 1-D tensor map of FP32 values (the backward's lse and glse): ``n`` elements, boxes of ``box``.
struct EmuMap1 {
  const float* base;
  long long n;
  int box;
};
inline void tma_load_1d(void* dst, const void* map, uint64_t* bar, int c0) {
  const EmuMap1& m = *(const EmuMap1*)map;
  const uint32_t base = sm90::smem_addr(dst);
  // the H200 raises "illegal instruction" on a 1-D box whose first element is not 16-byte aligned
  // (tools/diag_attention.py, results/lead13.md): the model refuses it too
  if (base % 128 || (m.box * 4) % 16 || (4LL * c0) % 16) emu::failed = 2;
  for (int i = 0; i < m.box; ++i) {
    const float v = c0 + i < m.n ? m.base[c0 + i] : 0.f;
    std::memcpy(emu::smem_base + base + 4 * i, &v, 4);
  }
  sm90::complete_tx(bar, (uint32_t)(m.box * 4));
}
inline float ld_shared_f32(uint32_t addr) {
  float v;
  std::memcpy(&v, emu::smem_base + addr, 4);
  return v;
}
inline float2 ld_shared_f32x2(uint32_t addr) {
  if (addr % 8) emu::failed = 2;  // ld.shared.v2 needs 8-byte alignment
  return make_float2(ld_shared_f32(addr), ld_shared_f32(addr + 4));
}
inline void st_shared_f32(uint32_t addr, float v) { std::memcpy(emu::smem_base + addr, &v, 4); }
inline uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  std::memcpy(&v, emu::smem_base + addr, 16);
  return v;
}
inline float2 bf2_to_f2(uint32_t u) {
  return make_float2(__bfloat162float(__nv_bfloat16{(uint16_t)(u & 0xffffu)}), __bfloat162float(__nv_bfloat16{(uint16_t)(u >> 16)}));
}
inline uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  std::memcpy(&v, emu::smem_base + addr, 4);
  return v;
}
}  // namespace awg
}  // namespace latch

#define exp2f(x) std::exp2((float)(x))
#define log2f(x) std::log2((float)(x))
#define fmaxf(a, b) fmaxf_((a), (b))

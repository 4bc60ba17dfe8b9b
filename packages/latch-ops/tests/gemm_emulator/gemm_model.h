// A CPU model of what latch_gemm.cuh and latch_gemm_pingpong.cuh use from the worker and the
// hardware, for the CPU test (test_gemm_emulated.py): the producer thread and the 256 consumer
// threads are fibers (emulator_gemm.cpp; attention_emulator/fibers.h), mbarriers count arrivals
// and transaction bytes and complete phases (an arrival past the expected count is an error), a
// 2-D TMA load writes its box at once (zeros outside the tensor) with the 128-byte swizzle, a TMA
// store writes a swizzled box of shared memory to the tensor (clipped at its edges), and wgmma is a
// warpgroup-collective product reading A and B through their shared-memory descriptors (K-major, or
// M-/N-major in 64-element blocks). Layouts follow the PTX ISA ("Matrix Descriptor Format", "Shared
// Memory Matrix Layout" and the m64nNk16 accumulator fragments of wgmma), written independently of
// the bodies. Nothing is asynchronous: the model checks indexing, the epilogues' boxes and slots,
// and the order in which the roles fill and release the ring's stages (a disagreement hangs: the
// model reports it).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "latch_common.cuh"  // attention_emulator's: bfloat16, threadIdx, __device__

#define LATCH_EMULATED_GEMM 1
#define __noinline__ __attribute__((noinline))  // (after the standard headers: CUDA's spelling)
#define __syncwarp() emu::warp_barrier()

struct __half { uint16_t x; };
struct __half2 { __half x, y; };
inline __half2 __floats2half2_rn(float, float) { return __half2{}; }  // (F16 is not modelled: BF16 and FP32 only)

namespace emu {
extern char* smem_base;  // the emulated shared memory (1024-byte aligned): smem_addr is an offset in it
extern int failed;  // 1: a wait gave up; 2: a TMA box the hardware refuses; 4: a descriptor; 5: a named barrier; 6: an mbarrier over-arrived
void yield_now();
void warp_barrier();
void wgmma(float* d, int n, uint64_t adesc, uint64_t bdesc, int scale_d, int ta, int tb);
void named_arrive(int id, int threads);  // bar.arrive / bar.sync: 5 when not the ping-pong turns (14, 15 over 256)
void named_sync(int id, int threads);
struct Mbar {
  long phase = 0;  // completed phases
  int arrivals = 0, count = 1;
  long tx = 0;
};
Mbar& mbar(uint64_t* bar);
inline uint32_t swizzle128(uint32_t logical) { return logical ^ (((logical >> 7) & 7u) << 4); }
template <class X> inline void put_shared(uint32_t addr, float a, float b);
template <> inline void put_shared<__nv_bfloat16>(uint32_t addr, float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  std::memcpy(smem_base + addr, &v, 4);
}
template <> inline void put_shared<float>(uint32_t addr, float a, float b) {
  std::memcpy(smem_base + addr, &a, 4);
  std::memcpy(smem_base + addr + 4, &b, 4);
}
template <> inline void put_shared<__half>(uint32_t, float, float) { failed = 9; }
}  // namespace emu

namespace latch {

template <class T, class V> inline void st(T* p, long long i, V v);
template <> inline void st<float, float>(float* p, long long i, float v) { p[i] = v; }
template <> inline void st<__nv_bfloat16, float>(__nv_bfloat16* p, long long i, float v) { p[i] = float2bf16_rn(v); }
template <> inline void st<__half, float>(__half*, long long, float) { emu::failed = 9; }

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
    if (n > 20000 || emu::failed) {  // the hang detector: every legitimate wait of the tests passes well under it
      if (!emu::failed) emu::failed = 1;
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
  if (m.arrivals > m.count) emu::failed = 6;
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
inline void wgmma_commit() {}
template <int N> inline void wgmma_wait() {}
inline void fence_proxy_async_shared() {}
inline void bulk_commit() {}
template <int N> inline void bulk_wait() {}
template <int N> inline void bulk_wait_read() {}
#define LATCH_EMU_WGMMA(N)                                                                            \
  template <int TA, int TB> inline void wgmma_bf16_m64n##N##k16(float (&d)[N / 2], uint64_t a, uint64_t b, int s) { \
    emu::wgmma(d, N, a, b, s, TA, TB);                                                                \
  }                                                                                                   \
  template <int TA, int TB> inline void wgmma_f16_m64n##N##k16(float (&)[N / 2], uint64_t, uint64_t, int) { emu::failed = 9; }
LATCH_EMU_WGMMA(16)
LATCH_EMU_WGMMA(32)
LATCH_EMU_WGMMA(64)
LATCH_EMU_WGMMA(96)
LATCH_EMU_WGMMA(128)
LATCH_EMU_WGMMA(192)
LATCH_EMU_WGMMA(256)
#undef LATCH_EMU_WGMMA

// A tensor map in the model: a row-major tensor of 2-D dims (innermost first), its element size and box.
struct EmuMap {
  char* base;
  int esize;
  long long dims[2];
  int box[2];
};
inline void tma_load_2d(void* dst, const void* map, uint64_t* bar, int c0, int c1) {
  const EmuMap& m = *(const EmuMap*)map;
  const uint32_t base = smem_addr(dst);
  if (base % 1024 || m.box[0] * m.esize != 128) emu::failed = 2;  // what the bodies must respect
  for (int r = 0; r < m.box[1]; ++r)
    for (int c = 0; c < m.box[0]; ++c) {
      const long long i0 = (long long)c0 + c, i1 = (long long)c1 + r;
      char v[4] = {0, 0, 0, 0};
      if (i0 < m.dims[0] && i1 < m.dims[1]) std::memcpy(v, m.base + (i1 * m.dims[0] + i0) * m.esize, m.esize);
      std::memcpy(emu::smem_base + emu::swizzle128(base + 128 * r + m.esize * c), v, m.esize);
    }
  complete_tx(bar, (uint32_t)(m.box[0] * m.box[1] * m.esize));
}
inline void tma_store_2d(const void* map, const void* src, int c0, int c1) {
  const EmuMap& m = *(const EmuMap*)map;
  const uint32_t base = smem_addr(src);
  if (base % 1024 || m.box[0] * m.esize != 128) emu::failed = 2;
  for (int r = 0; r < m.box[1]; ++r)
    for (int c = 0; c < m.box[0]; ++c) {
      const long long i0 = (long long)c0 + c, i1 = (long long)c1 + r;
      if (i0 < m.dims[0] && i1 < m.dims[1])
        std::memcpy(m.base + (i1 * m.dims[0] + i0) * m.esize, emu::smem_base + emu::swizzle128(base + 128 * r + m.esize * c),
                    m.esize);
    }
}
}  // namespace sm90

inline void mbar_arrive_count(uint64_t* bar, uint32_t count) {
  emu::Mbar& m = emu::mbar(bar);
  m.arrivals += (int)count;
  sm90::mbar_check(m);
}
inline void gemm_pp_pass_turn(int to) { emu::named_arrive(14 + to, 256); }
inline void gemm_pp_take_turn(int wg) { emu::named_sync(14 + wg, 256); }
}  // namespace latch

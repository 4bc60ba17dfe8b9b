// A CPU model of the few CUDA features latch_attention_mma.cuh uses, for the CPU test
// (test_attention_emulated.py): the block's 256 consumer threads are fibers on one OS thread
// (ucontext, switched only at barriers, so a run is deterministic), a warp's shuffles and its
// mma.sync m16n8k16 exchange values through per-warp buffers, with the fragment layouts of the
// PTX ISA ("Matrix Fragments for mma.m16n8k16"), written here independently of the body.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#define __device__
#define __forceinline__ inline
#define LATCH_THREADS 256
#define LATCH_EMULATED_MMA 1

struct Dim3 { unsigned x; };
extern thread_local Dim3 threadIdx;  // set per fiber by the scheduler (one OS thread: see emulator.cpp)

struct __nv_bfloat16 { uint16_t x; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
struct uint4 { uint32_t x, y, z, w; };
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return uint4{a, b, c, d}; }
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline float2 make_float2(float a, float b) { return float2{a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }

inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t)h.x << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 float2bf16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return __nv_bfloat16{(uint16_t)(u >> 16)};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162{float2bf16_rn(a), float2bf16_rn(b)}; }

namespace emu {
void block_barrier();
void warp_barrier();
float* warp_fbuf();
uint32_t* warp_abuf();  // [32][4]
uint32_t* warp_bbuf();  // [32][2]
}  // namespace emu

inline float __shfl_xor_sync(unsigned, float v, int off) {
  const int lane = threadIdx.x & 31;
  float* buf = emu::warp_fbuf();
  buf[lane] = v;
  emu::warp_barrier();
  const float r = buf[lane ^ off];
  emu::warp_barrier();
  return r;
}

namespace latch {
inline void block_sync() { emu::block_barrier(); }
inline float inf() { return INFINITY; }

namespace amma {
inline float bf_half(uint32_t reg, int hi) { return __bfloat162float(__nv_bfloat16{(uint16_t)(hi ? reg >> 16 : reg & 0xffffu)}); }

// D = A B + C for one warp: every lane hands in its fragments, then computes its own C entries.
// cp.async as a plain copy (the model has no asynchrony: the body's waits and barriers order it)
inline void cp_async16(void* dst, const void* src, bool valid) {
  if (valid) std::memcpy(dst, src, 16);
  else std::memset(dst, 0, 16);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}

inline void mma16816(float* c, const uint32_t* a, const uint32_t* b) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint32_t* A = emu::warp_abuf();
  uint32_t* B = emu::warp_bbuf();
  for (int i = 0; i < 4; ++i) A[lane * 4 + i] = a[i];
  for (int i = 0; i < 2; ++i) B[lane * 2 + i] = b[i];
  emu::warp_barrier();
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    float acc = 0.f;
    for (int k = 0; k < 16; ++k) {
      // A (row, k): lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) + 2 (k >= 8), half k % 2
      const float av = bf_half(A[((row % 8) * 4 + (k % 8) / 2) * 4 + (row >= 8) + 2 * (k >= 8)], k % 2);
      // B (k, col): lane col * 4 + (k % 8) / 2, register (k >= 8), half k % 2
      const float bv = bf_half(B[(col * 4 + (k % 8) / 2) * 2 + (k >= 8)], k % 2);
      acc += av * bv;
    }
    c[e] += acc;
  }
  emu::warp_barrier();
}
}  // namespace amma
}  // namespace latch

// Latch op bodies: common device helpers (dtype loads/stores, block reductions, error reports).
//
// Every op body runs inside the persistent megakernel on its LATCH_THREADS (256) consumer threads,
// threadIdx.x 0..255 of the block (the block also holds the producer warp, see
// latch_codegen_h100/cuda/latch_kernel_main.cuh), called by every consumer thread, with a tile of
// its primary output given at run time. A body must therefore (1) be correct for any tile inside
// its output, (2) leave the consumers converged (every thread returns; the kernel places a
// barrier after each body), (3) never assume its scratch shared memory survives past its return,
// and (4) synchronise with latch::block_sync() (named barrier 1 over the consumers), never with
// __syncthreads(), which would wait for the producer too, and size loops by LATCH_THREADS, not
// blockDim.x (the block is larger).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#ifndef LATCH_THREADS
#define LATCH_THREADS 256
#endif

namespace latch {

typedef long long i64;

// The consumers' block-wide barrier (named barrier 1; 0 is __syncthreads').
__device__ __forceinline__ void block_sync() { asm volatile("bar.sync 1, %0;" ::"n"(LATCH_THREADS) : "memory"); }

// Error codes a body may report (the runtime turns them into exceptions naming the task's node).
enum BodyError : int {
  ERR_INDEX_RANGE = 4,  // an index operand is outside [0, bound)
};

}  // namespace latch

// Defined by the generated kernel unit: records the first error of a launch, with the reporting
// block's current task, and asks every block to stop.
extern "C" __device__ void latch_report(int code, long long a, long long b);

namespace latch {

__device__ __forceinline__ float inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float qnan() { return __int_as_float(0x7fc00000); }

// ---- loads and stores in compute type (float for 16-bit floats, long long for integers) -------
template <class S> struct Compute { typedef S type; };
template <> struct Compute<__nv_bfloat16> { typedef float type; };
template <> struct Compute<__half> { typedef float type; };
template <> struct Compute<int> { typedef long long type; };
template <> struct Compute<short> { typedef long long type; };
template <> struct Compute<signed char> { typedef long long type; };
template <> struct Compute<unsigned char> { typedef long long type; };

template <class S> __device__ __forceinline__ typename Compute<S>::type ld(const S* p, i64 i) {
  return (typename Compute<S>::type)p[i];
}
template <> __device__ __forceinline__ float ld<__nv_bfloat16>(const __nv_bfloat16* p, i64 i) {
  return __bfloat162float(p[i]);
}
template <> __device__ __forceinline__ float ld<__half>(const __half* p, i64 i) { return __half2float(p[i]); }

template <class S, class V> __device__ __forceinline__ void st(S* p, i64 i, V v) { p[i] = (S)v; }
template <> __device__ __forceinline__ void st<__nv_bfloat16, float>(__nv_bfloat16* p, i64 i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ void st<__nv_bfloat16, double>(__nv_bfloat16* p, i64 i, double v) {
  p[i] = __float2bfloat16_rn((float)v);
}
template <> __device__ __forceinline__ void st<__half, float>(__half* p, i64 i, float v) { p[i] = __float2half_rn(v); }
template <> __device__ __forceinline__ void st<__half, double>(__half* p, i64 i, double v) {
  p[i] = __float2half_rn((float)v);
}

// Round a float to bf16 and back (what a BF16 operand of a matrix product sees).
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float round_f16(float x) { return __half2float(__float2half_rn(x)); }

// ---- reductions over the block ----------------------------------------------------------------
template <class T> __device__ __forceinline__ T lowest() { return -T(inf()); }
template <class T> __device__ __forceinline__ T highest() { return T(inf()); }
template <> __device__ __forceinline__ long long lowest<long long>() { return (long long)(-9223372036854775807LL - 1); }
template <> __device__ __forceinline__ long long highest<long long>() { return 9223372036854775807LL; }

struct SumOp {
  template <class T> __device__ __forceinline__ static T init() { return T(0); }
  template <class T> __device__ __forceinline__ static T apply(T a, T b) { return a + b; }
};
struct MaxOp {  // NaN-propagating, like torch.amax
  template <class T> __device__ __forceinline__ static T init() { return lowest<T>(); }
  template <class T> __device__ __forceinline__ static T apply(T a, T b) { return (a != a || a > b) ? a : b; }
};
struct MinOp {
  template <class T> __device__ __forceinline__ static T init() { return highest<T>(); }
  template <class T> __device__ __forceinline__ static T apply(T a, T b) { return (a != a || a < b) ? a : b; }
};

template <class Op, class T> __device__ __forceinline__ T warp_reduce(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, (T)__shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduce one value per thread over the whole block; every thread gets the result.
// ``scratch`` holds at least 33 values of T; the call ends with the scratch free again.
template <class Op, class T> __device__ __forceinline__ T block_reduce(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = LATCH_THREADS >> 5;
  v = warp_reduce<Op>(v);
  latch::block_sync();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  latch::block_sync();
  if (warp == 0) {
    T w = lane < nwarps ? scratch[lane] : Op::template init<T>();
    w = warp_reduce<Op>(w);
    if (lane == 0) scratch[32] = w;
  }
  latch::block_sync();
  return scratch[32];
}

// ---- atomic accumulation into a value of any stored type (scatter_add, index_add, embedding bwd)
__device__ __forceinline__ void atomic_add(float* p, double v) { atomicAdd(p, (float)v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(__nv_bfloat16* p, double v) { atomicAdd(p, __float2bfloat16_rn((float)v)); }
__device__ __forceinline__ void atomic_add(__half* p, double v) { atomicAdd(p, __float2half_rn((float)v)); }
__device__ __forceinline__ void atomic_add(long long* p, long long v) {
  atomicAdd((unsigned long long*)p, (unsigned long long)v);
}
__device__ __forceinline__ void atomic_add(int* p, long long v) { atomicAdd(p, (int)v); }

// Bytes of scratch a body must reserve at the start of its shared memory for block_reduce.
constexpr int REDUCE_SCRATCH_BYTES = 33 * 8;

}  // namespace latch

// ---- four consecutive elements at once (the fused elementwise bodies' vector path) --------------
// ``p + i`` must be aligned to 4 * sizeof(S) bytes: the generated body checks every operand before it
// takes the vector path. 4-byte types move as one 16-byte access, 2-byte ones as one 8-byte access;
// other types element by element. Plain (coherent) accesses: the persistent kernel writes what later
// tasks read, so the read-only path (ld.global.nc) would be wrong.
namespace latch {
namespace detail {
template <class S, int W = sizeof(S)> struct Vec4 {
  __device__ __forceinline__ static void ld(const S* p, i64 i, typename Compute<S>::type (&r)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) r[j] = latch::ld<S>(p, i + j);
  }
  template <class V> __device__ __forceinline__ static void st(S* p, i64 i, const V (&v)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) latch::st<S>(p, i + j, v[j]);
  }
};
template <> struct Vec4<float, 4> {
  __device__ __forceinline__ static void ld(const float* p, i64 i, float (&r)[4]) {
    const float4 q = *reinterpret_cast<const float4*>(p + i);
    r[0] = q.x; r[1] = q.y; r[2] = q.z; r[3] = q.w;
  }
  template <class V> __device__ __forceinline__ static void st(float* p, i64 i, const V (&v)[4]) {
    *reinterpret_cast<float4*>(p + i) = make_float4((float)v[0], (float)v[1], (float)v[2], (float)v[3]);
  }
};
template <> struct Vec4<__nv_bfloat16, 2> {
  __device__ __forceinline__ static void ld(const __nv_bfloat16* p, i64 i, float (&r)[4]) {
    const uint2 q = *reinterpret_cast<const uint2*>(p + i);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.y));
    r[0] = a.x; r[1] = a.y; r[2] = b.x; r[3] = b.y;
  }
  template <class V> __device__ __forceinline__ static void st(__nv_bfloat16* p, i64 i, const V (&v)[4]) {
    const __nv_bfloat162 a = __floats2bfloat162_rn((float)v[0], (float)v[1]);
    const __nv_bfloat162 b = __floats2bfloat162_rn((float)v[2], (float)v[3]);
    uint2 q;
    q.x = *reinterpret_cast<const unsigned*>(&a);
    q.y = *reinterpret_cast<const unsigned*>(&b);
    *reinterpret_cast<uint2*>(p + i) = q;
  }
};
}  // namespace detail

template <class S> __device__ __forceinline__ void ld4(const S* p, i64 i, typename Compute<S>::type (&r)[4]) {
  detail::Vec4<S>::ld(p, i, r);
}
template <class S, class V> __device__ __forceinline__ void st4(S* p, i64 i, const V (&v)[4]) {
  detail::Vec4<S>::st(p, i, v);
}
// Is ``p + i`` aligned for ld4/st4?
template <class S> __device__ __forceinline__ bool aligned4(const S* p, i64 i) {
  return ((reinterpret_cast<uintptr_t>(p + i)) & (4 * sizeof(S) - 1)) == 0;
}

}  // namespace latch

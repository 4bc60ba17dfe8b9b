// Elementwise math for fused bodies: one scalar function per op of the core vocabulary whose
// expression is more than an operator. Overloaded for float (f32/bf16/f16 compute in float) and
// double (f64); integers compute in long long. Semantics follow each op's torch reference
// (latch_ops/elementwise.py): NaN-propagating max/min/clamp, torch's floor division and gelu forms.
#pragma once

#include "latch_common.cuh"

namespace latch {
namespace ew {

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return ::exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return ::log(x); }
__device__ __forceinline__ float log1p_(float x) { return log1pf(x); }
__device__ __forceinline__ double log1p_(double x) { return ::log1p(x); }
__device__ __forceinline__ float expm1_(float x) { return expm1f(x); }
__device__ __forceinline__ double expm1_(double x) { return ::expm1(x); }
// float division, square root, reciprocal square root and reciprocal: branch-free full-range forms
// of at most 2 ulp (PTX .approx with subnormal handling), not the IEEE-rounded ones: those compile to
// a MUFU op, fix-ups and a compare guarding an out-of-line slow path, each in its own convergence
// region, so the compiler cannot interleave independent elements (AdamW's sqrt and two divisions
// per element serialised its body). The asm is pure (not volatile): a loop-invariant operand's part
// (a division by a per-task scalar) hoists out of the loop. f64 keeps the IEEE operations.
__device__ __forceinline__ float rcp_(float x) {  // 1 ulp, full range (subnormals scaled)
  float r;
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ double rcp_(double x) { return 1.0 / x; }
__device__ __forceinline__ float div_(float a, float b) {
  // A denominator outside [2^-126, 2^126] is scaled (with the numerator) into it (div.full.f32's
  // method), q = a * (1 / b) with the MUFU reciprocal, then one FMA correction of the residual
  // (a - b q) / b: an exact quotient comes out exact and the rest within an ulp, branch-free. The
  // correction is skipped where it is undefined (q infinite or NaN, b zero or infinite), which
  // leaves IEEE's results for b = 0, inf, NaN and a = inf, NaN.
  const float ab = fabsf(b);
  const float s = ab > 0x1p126f ? 0.25f : (ab < 0x1p-126f ? 0x1p24f : 1.0f);
  const float as = a * s, bs = b * s;
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(bs));
  const float q = as * r;
  const float e = fmaf(-bs, q, as);
  const bool ok = fabsf(q) < __int_as_float(0x7f800000) && bs != 0.0f && fabsf(bs) < __int_as_float(0x7f800000);
  return ok ? fmaf(e, r, q) : q;
}
__device__ __forceinline__ double div_(double a, double b) { return a / b; }
__device__ __forceinline__ float sqrt_(float x) {
  float r;
  asm("sqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ double sqrt_(double x) { return ::sqrt(x); }
__device__ __forceinline__ float rsqrt_(float x) {
  float r;
  asm("rsqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ double rsqrt_(double x) { return 1.0 / ::sqrt(x); }
__device__ __forceinline__ float sin_(float x) { return sinf(x); }
__device__ __forceinline__ double sin_(double x) { return ::sin(x); }
__device__ __forceinline__ float cos_(float x) { return cosf(x); }
__device__ __forceinline__ double cos_(double x) { return ::cos(x); }
__device__ __forceinline__ float tanh_(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_(double x) { return ::tanh(x); }
__device__ __forceinline__ float erf_(float x) { return erff(x); }
__device__ __forceinline__ double erf_(double x) { return ::erf(x); }
__device__ __forceinline__ float pow_(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double pow_(double a, double b) { return ::pow(a, b); }
__device__ __forceinline__ long long pow_(long long a, long long b) {
  if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  long long r = 1;
  while (b) {
    if (b & 1) r *= a;
    a *= a;
    b >>= 1;
  }
  return r;
}
__device__ __forceinline__ float floor_(float x) { return floorf(x); }
__device__ __forceinline__ double floor_(double x) { return ::floor(x); }
__device__ __forceinline__ float trunc_(float x) { return truncf(x); }
__device__ __forceinline__ double trunc_(double x) { return ::trunc(x); }

template <class T> __device__ __forceinline__ T abs_(T x) { return x < T(0) ? -x : x; }
template <> __device__ __forceinline__ float abs_(float x) { return fabsf(x); }
template <> __device__ __forceinline__ double abs_(double x) { return fabs(x); }

template <class T> __device__ __forceinline__ T sign_(T x) { return x != x ? x : T((x > T(0)) - (x < T(0))); }
template <class T> __device__ __forceinline__ T relu_(T x) { return x != x ? x : (x > T(0) ? x : T(0)); }

template <class T> __device__ __forceinline__ T sigmoid_(T x) { return rcp_(T(1) + exp_(-x)); }
template <class T> __device__ __forceinline__ T silu_(T x) { return x * sigmoid_(x); }

template <class T> __device__ __forceinline__ T gelu_erf(T x) {
  return T(0.5) * x * (T(1) + erf_(x * T(0.70710678118654752440)));
}
template <class T> __device__ __forceinline__ T gelu_tanh(T x) {
  const T k = T(0.79788456080286535588);  // sqrt(2 / pi)
  return T(0.5) * x * (T(1) + tanh_(k * (x + T(0.044715) * x * x * x)));
}
template <class T> __device__ __forceinline__ T gelu_erf_backward(T g, T x) {
  const T cdf = T(0.5) * (T(1) + erf_(x * T(0.70710678118654752440)));
  const T pdf = exp_(T(-0.5) * x * x) * T(0.39894228040143267794);  // 1 / sqrt(2 pi)
  return g * (cdf + x * pdf);
}
template <class T> __device__ __forceinline__ T gelu_tanh_backward(T g, T x) {
  const T k = T(0.79788456080286535588), c = T(0.044715);
  const T inner = k * (x + c * x * x * x);
  const T t = tanh_(inner);
  const T left = T(0.5) * x, right = T(1) + t;
  const T left_d = T(0.5) * right;
  const T right_d = left * (T(1) - t * t) * k * (T(1) + T(3) * c * x * x);
  return g * (left_d + right_d);
}
template <class T> __device__ __forceinline__ T silu_backward(T g, T x) {
  const T s = sigmoid_(x);
  return g * s * (T(1) + x * (T(1) - s));
}

// NaN-propagating maximum / minimum (torch.maximum / torch.minimum).
template <class T> __device__ __forceinline__ T maximum_(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a > b ? a : b)); }
template <class T> __device__ __forceinline__ T minimum_(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a < b ? a : b)); }

// torch.div rounding modes.
__device__ __forceinline__ float div_floor(float a, float b) { return floorf(a / b); }
__device__ __forceinline__ double div_floor(double a, double b) { return ::floor(a / b); }
__device__ __forceinline__ long long div_floor(long long a, long long b) {
  long long q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__device__ __forceinline__ float div_trunc(float a, float b) { return truncf(a / b); }
__device__ __forceinline__ double div_trunc(double a, double b) { return ::trunc(a / b); }
__device__ __forceinline__ long long div_trunc(long long a, long long b) { return a / b; }

// clamp keeps NaN (comparisons with NaN are false).
template <class T> __device__ __forceinline__ T clamp_min(T x, T lo) { return x < lo ? lo : x; }
template <class T> __device__ __forceinline__ T clamp_max(T x, T hi) { return x > hi ? hi : x; }

}  // namespace ew
}  // namespace latch

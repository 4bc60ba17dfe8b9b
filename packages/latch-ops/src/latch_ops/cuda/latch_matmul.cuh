// Matrix product body: C[b, m, n] = sum_k A[b, m, k] * B[b, k, n] for one tile of C, k in
// [k_begin, k_end) (a split-K partial; the whole K otherwise).
// TRANS_A / TRANS_B read A as [K, M] / B as [N, K] in memory (matmul's trans flags, the ragged MoE
// gradients).
//
// Simple and correct first: 64 x 64 blocks of C per step, K in slices of 32 staged through shared
// memory, each of the 256 threads accumulating a 4 x 4 sub-block in registers (Acc: float, or
// double for f64 operands). ROUND models the node's ``operand_dtype``: 0 = none, 1 = operands
// rounded to bf16, 2 = to f16, before the multiply (products and sums stay in Acc, as a BF16
// tensor-core product with FP32 accumulation does).
#pragma once

#include "latch_common.cuh"

namespace latch {

template <int ROUND> __device__ __forceinline__ float round_operand(float x) {
  return ROUND == 1 ? round_bf16(x) : (ROUND == 2 ? round_f16(x) : x);
}
template <int ROUND> __device__ __forceinline__ double round_operand(double x) {
  return ROUND == 1 ? (double)round_bf16((float)x) : (ROUND == 2 ? (double)round_f16((float)x) : x);
}

constexpr int MM_BM = 64, MM_BN = 64, MM_BK = 32, MM_PAD = 1;

template <class Acc> constexpr int matmul_smem_bytes() {
  return (int)sizeof(Acc) * MM_BK * ((MM_BM + MM_PAD) + (MM_BN + MM_PAD));
}

template <class TA, class TB, class TC, class Acc, int ROUND, bool TRANS_A = false, bool TRANS_B = false>
__device__ void matmul_tile(const TA* A, const TB* B, TC* C, long long M, long long N, long long K, long long b_lo,
                            long long b_hi, long long m_lo, long long m_hi, long long n_lo, long long n_hi,
                            char* smem, long long k_begin = 0, long long k_end = -1) {
  if (k_end < 0) k_end = K;
  constexpr int LDA = MM_BM + MM_PAD, LDB = MM_BN + MM_PAD;
  Acc* As = (Acc*)smem;           // [BK][LDA], As[k][m]
  Acc* Bs = As + MM_BK * LDA;     // [BK][LDB], Bs[k][n]
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  for (long long b = b_lo; b < b_hi; ++b) {
    const TA* Ab = A + b * M * K;
    const TB* Bb = B + b * K * N;
    TC* Cb = C + b * M * N;
    for (long long m0 = m_lo; m0 < m_hi; m0 += MM_BM) {
      for (long long n0 = n_lo; n0 < n_hi; n0 += MM_BN) {
        Acc acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = Acc(0);
        for (long long k0 = k_begin; k0 < k_end; k0 += MM_BK) {
          for (int e = tid; e < MM_BM * MM_BK; e += LATCH_THREADS) {
            const int r = e / MM_BK, kk = e % MM_BK;
            const long long gm = m0 + r, gk = k0 + kk;
            Acc v = (gm < m_hi && gk < k_end) ? (Acc)ld<TA>(Ab, TRANS_A ? gk * M + gm : gm * K + gk) : Acc(0);
            As[kk * LDA + r] = round_operand<ROUND>(v);
          }
          for (int e = tid; e < MM_BK * MM_BN; e += LATCH_THREADS) {
            const int kk = e / MM_BN, cc = e % MM_BN;
            const long long gk = k0 + kk, gn = n0 + cc;
            Acc v = (gk < k_end && gn < n_hi) ? (Acc)ld<TB>(Bb, TRANS_B ? gn * K + gk : gk * N + gn) : Acc(0);
            Bs[kk * LDB + cc] = round_operand<ROUND>(v);
          }
          latch::block_sync();
#pragma unroll 8
          for (int kk = 0; kk < MM_BK; ++kk) {
            Acc a[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = As[kk * LDA + ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) bv[j] = Bs[kk * LDB + tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
              for (int j = 0; j < 4; ++j) acc[i][j] = fma(a[i], bv[j], acc[i][j]);
          }
          latch::block_sync();
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const long long gm = m0 + ty + 16 * i;
          if (gm >= m_hi) continue;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const long long gn = n0 + tx + 16 * j;
            if (gn < n_hi) st<TC>(Cb, gm * N + gn, acc[i][j]);
          }
        }
      }
    }
  }
}

}  // namespace latch

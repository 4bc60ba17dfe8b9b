// Runs latch_attention_mma.cuh's bodies on the CPU (see latch_common.cuh here): 256 fibers, one per
// consumer thread, switched at barriers only; the tasks are those of latch_ops.attention's tilings
// (forward: 128 query rows of one (b, h); backward: a group of query heads and 64 rows: dq of
// the rows, dk/dv of the key block with the same index), called in the same order by every fiber.
#include <ucontext.h>

#include <vector>

#include "latch_common.cuh"
#include "latch_attention_mma.cuh"

thread_local Dim3 threadIdx;

namespace emu {
constexpr int N = 256;
#include "fibers.h"
static Barrier block_bar{N};
static Barrier warp_bar[N / 32] = {{32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}};
static float fbuf[N / 32][32];
static uint32_t abuf[N / 32][32 * 4], bbuf[N / 32][32 * 2];

void block_barrier() { wait(block_bar); }
void warp_barrier() { wait(warp_bar[threadIdx.x >> 5]); }
float* warp_fbuf() { return fbuf[threadIdx.x >> 5]; }
uint32_t* warp_abuf() { return abuf[threadIdx.x >> 5]; }
uint32_t* warp_bbuf() { return bbuf[threadIdx.x >> 5]; }

}  // namespace emu

struct Args {
  int D, causal, B, H, Hkv;
  long long Tq, Tk;
  float scale;
  const void *q, *k, *v, *go, *o;
  const float *lse_in, *glse;
  void *out, *dq, *dk, *dv;
  float* lse;
  char* smem;
};

template <int D, bool C, class S>
static void fwd_all(const Args& a) {
  const int G = a.H / a.Hkv;
  const S *q = (const S*)a.q, *k = (const S*)a.k, *v = (const S*)a.v;
  S* out = (S*)a.out;
  for (int b = 0; b < a.B; ++b)
    for (int h = 0; h < a.H; ++h)
      for (long long r = 0; r < a.Tq; r += 128) {
        const long long bh = (long long)b * a.H + h, bkv = (long long)b * a.Hkv + h / G;
        latch::amma::sdpa_forward<D, C>(q + bh * a.Tq * D, k + bkv * a.Tk * D, v + bkv * a.Tk * D,
                                        out + bh * a.Tq * D, a.lse + bh * a.Tq, r, r + 128 < a.Tq ? r + 128 : a.Tq,
                                        a.Tq, a.Tk, a.scale, a.smem);
      }
}

template <int D, bool C, class S>
static void bwd_all(const Args& a) {
  const int G = a.H / a.Hkv;
  const S *q = (const S*)a.q, *k = (const S*)a.k, *v = (const S*)a.v, *go = (const S*)a.go, *o = (const S*)a.o;
  S *dq = (S*)a.dq, *dk = (S*)a.dk, *dv = (S*)a.dv;
  for (int b = 0; b < a.B; ++b)
    for (int gi = 0; gi < a.Hkv; ++gi)
      for (long long r0 = 0; r0 < a.Tq; r0 += 64) {
        const long long r1 = r0 + 64 < a.Tq ? r0 + 64 : a.Tq;
        const long long k0 = r0 < a.Tk ? r0 : a.Tk, k1 = r1 >= a.Tq ? a.Tk : (r1 < a.Tk ? r1 : a.Tk);
        const long long bkv = (long long)b * a.Hkv + gi;
        for (int h = gi * G; h < gi * G + G; ++h) {
          const long long bh = (long long)b * a.H + h;
          latch::amma::sdpa_dq<D, C>(go + bh * a.Tq * D, a.glse ? a.glse + bh * a.Tq : nullptr, q + bh * a.Tq * D,
                                     k + bkv * a.Tk * D, v + bkv * a.Tk * D, o + bh * a.Tq * D, a.lse_in + bh * a.Tq,
                                     dq + bh * a.Tq * D, r0, r1, a.Tq, a.Tk, a.scale, a.smem);
        }
        const long long bg = (long long)b * a.H + gi * G;
        latch::amma::sdpa_dkdv<D, C>(go + bg * a.Tq * D, a.glse ? a.glse + bg * a.Tq : nullptr, q + bg * a.Tq * D,
                                     k + bkv * a.Tk * D, v + bkv * a.Tk * D, o + bg * a.Tq * D, a.lse_in + bg * a.Tq,
                                     dk + bkv * a.Tk * D, dv + bkv * a.Tk * D, k0, k1, G, a.Tq, a.Tk, a.scale, a.smem);
      }
}

static int g_f32;  // storage of the operands and outputs: BF16 (0) or FP32 (1)

template <class S>
static void fwd_s(const Args& a) {
  if (a.D == 64) a.causal ? fwd_all<64, true, S>(a) : fwd_all<64, false, S>(a);
  else a.causal ? fwd_all<128, true, S>(a) : fwd_all<128, false, S>(a);
}
template <class S>
static void bwd_s(const Args& a) {
  if (a.D == 64) a.causal ? bwd_all<64, true, S>(a) : bwd_all<64, false, S>(a);
  else a.causal ? bwd_all<128, true, S>(a) : bwd_all<128, false, S>(a);
}
static void fwd_job(void* p) { g_f32 ? fwd_s<float>(*(const Args*)p) : fwd_s<__nv_bfloat16>(*(const Args*)p); }
static void bwd_job(void* p) { g_f32 ? bwd_s<float>(*(const Args*)p) : bwd_s<__nv_bfloat16>(*(const Args*)p); }

extern "C" int attn_forward(int D, int causal, int f32, int B, int H, int Hkv, long long Tq, long long Tk, float scale,
                            const void* q, const void* k, const void* v, void* out, float* lse) {
  if (D != 64 && D != 128) return 1;
  std::vector<char> smem(latch::amma::backward_smem<128>(), (char)0x7f);  // poisoned scratch
  Args a{D, causal, B, H, Hkv, Tq, Tk, scale, q, k, v, nullptr, nullptr, nullptr, nullptr, out, nullptr, nullptr,
         nullptr, lse, smem.data()};
  g_f32 = f32;
  emu::run_block(fwd_job, &a);
  return 0;
}

extern "C" int attn_backward(int D, int causal, int f32, int B, int H, int Hkv, long long Tq, long long Tk,
                             float scale, const void* go, const float* glse, const void* q, const void* k,
                             const void* v, const void* o, const float* lse, void* dq, void* dk, void* dv) {
  if (D != 64 && D != 128) return 1;
  std::vector<char> smem(latch::amma::backward_smem<128>(), (char)0x7f);
  Args a{D, causal, B, H, Hkv, Tq, Tk, scale, q, k, v, go, o, lse, glse, nullptr, dq, dk, dv, nullptr, smem.data()};
  g_f32 = f32;
  emu::run_block(bwd_job, &a);
  return 0;
}

// Runs latch_attention_wgmma_bwd.cuh's backward on the CPU: the forward's model (emulator_wgmma.cpp,
// included whole: fibers, mbarriers, TMA boxes, wgmma) with the block-wide named barrier allowed and
// 1-D FP32 tensor maps for lse and glse. Tasks are boxes of (batch, query heads, rows) given by the
// test, walked in order by the producer fiber and the 256 consumers, each with its own ring position.
#include "emulator_wgmma.cpp"
#include "latch_attention_wgmma_bwd.cuh"

struct BwdArgs {
  int D, causal, H, Hkv, Tq, Tk, ntasks;
  float scale;
  const int* boxes;
  latch::awg::EmuMap mq, mk, mv, mgo, mo;
  latch::awg::EmuMap1 ml, mg;
  bool has_glse;
  __nv_bfloat16 *dq, *dk, *dv;
  latch::Pipe pipe;
  char* scratch;
  int variant;  // latch::awg::BwdVariant: 1 (wgmma), 2 (wgmma2)
};

template <int D, bool C, int V>
static void bwd_all(const BwdArgs& a) {
  latch::Pipe p = a.pipe;
  const latch::awg::BwdMaps maps{&a.mq, &a.mk, &a.mv, &a.mgo, &a.mo, &a.ml, a.has_glse ? &a.mg : nullptr};
  for (int i = 0; i < a.ntasks; ++i) {
    latch::Task t{};
    const int* bx = a.boxes + 6 * i;
    for (int d = 0; d < 3; ++d) {
      t.lo[d] = bx[2 * d];
      t.hi[d] = bx[2 * d + 1];
    }
    if (threadIdx.x == emu::PRODUCER) {
      if (!latch::awg::bwd_produce<D, C, V>(p, &t, maps, a.H, a.Hkv, a.Tq, a.Tk)) return;
    } else {
      if (!latch::awg::bwd_consume<D, C, V>(p, &t, a.dq, a.dk, a.dv, a.has_glse, a.H, a.Hkv, a.Tq, a.Tk, a.scale,
                                         a.scratch))
        return;
      if (emu::wgmma_pending()) emu::failed = 6;  // a task ended with products never waited for
    }
  }
}

static void bwd_job(void* p) {
  const BwdArgs& a = *(const BwdArgs*)p;
  if (a.variant == 2) {
    if (a.D == 64) a.causal ? bwd_all<64, true, 2>(a) : bwd_all<64, false, 2>(a);
    else a.causal ? bwd_all<128, true, 2>(a) : bwd_all<128, false, 2>(a);
  } else {
    if (a.D == 64) a.causal ? bwd_all<64, true, 1>(a) : bwd_all<64, false, 1>(a);
    else a.causal ? bwd_all<128, true, 1>(a) : bwd_all<128, false, 1>(a);
  }
}

static int bwd_variant = 1;
// The body the next attn_backward_wgmma runs: 1 (bwd_consume<D, C, 1>: "wgmma"), 2 ("wgmma2").
extern "C" int attn_backward_wgmma_variant(int v) {
  if (v != 1 && v != 2) return 9;
  bwd_variant = v;
  return 0;
}

// The same return codes as attn_forward_wgmma.
extern "C" int attn_backward_wgmma(int D, int causal, int B, int H, int Hkv, int Tq, int Tk, float scale, int stages,
                                   int ntasks, const int* boxes, const void* q, const void* k, const void* v,
                                   const void* go, const void* o, const float* lse, const float* glse, void* dq,
                                   void* dk, void* dv) {
  if ((D != 64 && D != 128) || stages < 2) return 9;
  // the worker's ring: stages of the body's size rounded up to 1 KiB (codegen.ring_geometry)
  const int need = D == 64 ? latch::awg::BwdShape<64>::STAGE : latch::awg::BwdShape<128>::STAGE;
  const int stage_bytes = (need + 1023) / 1024 * 1024;
  const int scratch = D == 64 ? latch::awg::BwdShape<64>::SCRATCH : latch::awg::BwdShape<128>::SCRATCH;
  const size_t bytes = (size_t)stages * stage_bytes + scratch;
  void* mem = std::aligned_alloc(1024, (bytes + 1023) / 1024 * 1024);
  std::memset(mem, 0x7f, bytes);  // poisoned: a stage read before it is filled shows
  emu::smem_base = (char*)mem;
  emu::failed = 0;
  emu::allow_block = true;
  emu::reset_wgmma();
  emu::bars.clear();
  std::vector<uint64_t> full(stages), empty(stages);
  for (int s = 0; s < stages; ++s) {
    emu::mbar(&full[s]).count = 1;
    emu::mbar(&empty[s]).count = 8;
  }
  typedef const __nv_bfloat16* P;
  BwdArgs a{D, causal, H, Hkv, Tq, Tk, ntasks, scale, boxes,
            {(P)q, {D, Tq, B * H}, {64, 64, 1}},
            {(P)k, {D, Tk, B * Hkv}, {64, 64, 1}},
            {(P)v, {D, Tk, B * Hkv}, {64, 64, 1}},
            {(P)go, {D, Tq, B * H}, {64, 64, 1}},
            {(P)o, {D, Tq, B * H}, {64, 64, 1}},
            {lse, (long long)B * H * Tq, latch::awg::BwdShape<64>::LSE_BOX},
            {glse, (long long)B * H * Tq, latch::awg::BwdShape<64>::LSE_BOX},
            glse != nullptr,
            (__nv_bfloat16*)dq, (__nv_bfloat16*)dk, (__nv_bfloat16*)dv,
            latch::Pipe{(char*)mem, full.data(), empty.data(), stages, stage_bytes, 0, 0},
            (char*)mem + (size_t)stages * stage_bytes, bwd_variant};
  emu::run_block(bwd_job, &a);
  std::free(mem);
  return emu::failed;
}

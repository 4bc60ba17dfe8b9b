// The megakernel's run-time interface: the binary table records, the kernel arguments, and the
// synchronisation primitives (grid barrier, dataflow counters) with spin timeouts.
//
// These records are mirrored byte for byte by latch_codegen_h100.tables (Python, struct module)
// and latch_codegen_h100.runtime (ctypes). Change all three together and bump LATCH_ABI_VERSION.
#pragma once

#include <stdint.h>
#include <type_traits>

#include "latch_common.cuh"
#include "latch_pipe.cuh"

#define LATCH_ABI_VERSION 4
#define LATCH_MAX_DIMS 8

namespace latch {

// I_TICKET (a, b, c): take tasks from queue instructions [b, b + c) of Args::instrs by tickets of
// counter a until it is drained (latch_codegen_h100.tickets).
enum InstrKind : int { I_TASK = 1, I_BARRIER = 2, I_WAIT = 3, I_SIGNAL = 4, I_TICKET = 5 };

enum KernelError : int {
  ERR_WAIT_TIMEOUT = 1,     // a counter wait did not see enough signals in time
  ERR_BARRIER_TIMEOUT = 2,  // not every block arrived at a grid barrier in time
  ERR_BAD_BODY = 3,         // a task names a body id this build does not have
  // ERR_INDEX_RANGE = 4 (latch_common.cuh)
  // ERR_PIPE_TIMEOUT = 5 (latch_pipe.cuh): the worker's producer and consumers disagree about the ring (a body bug)
};

// One task: 24 x int32 = 96 bytes.
struct Task {
  int32_t body;      // body id (index into the dispatch switch)
  int32_t task;      // task id in the schedule
  int32_t group;     // fusion group id
  int32_t ndim;      // rank of the tile
  int32_t op_begin;  // first operand record of the task's group
  int32_t op_count;
  int32_t tmap;      // first tensor map (Args::tmaps) of the task's group; -1: its body loads none
  int32_t dep;       // the latest earlier task of this SM list and phase (since its last grid barrier)
                     // whose outputs this task's TMA loads read, as its position among the phase's
                     // tasks of the list; -1: none (loads may start early)
  int32_t lo[LATCH_MAX_DIMS];
  int32_t hi[LATCH_MAX_DIMS];
};

// One operand: where the bytes are (buffer index into Args::buffers, byte offset). 16 bytes.
struct Operand {
  int32_t buffer;
  int32_t pad;
  int64_t offset;
};

// One instruction of an SM's list. 16 bytes.
struct Instr {
  int32_t kind, a, b, c;
};

// The launch's error record (first error wins; ``abort`` makes every spinning block stop).
struct Error {
  int32_t code;
  int32_t block;
  int32_t pc;        // instruction index (within the block's list) being executed
  int32_t task;      // current task id (-1 when not inside a task)
  int32_t counter;   // counter or barrier id waited on
  uint32_t value;    // value observed (relative to the launch's base)
  uint32_t target;   // value waited for (relative to the launch's base)
  int32_t abort;
  int32_t program;   // Args::program of the launch that failed
  int32_t pad;
  long long a, b;    // body error details (e.g. index and bound)
};

struct Args {
  const Instr* instrs;      // every SM list, back to back
  const int32_t* sm_begin;  // [num_lists + 1] start of each list in instrs; queue tasks follow the lists
  const Task* tasks;
  const Operand* operands;
  char* const* buffers;     // [0] arena, then external buffers in manifest order
  uint32_t* counters;       // this program's dataflow counters
  const uint32_t* expected; // signals per launch, per counter
  uint32_t* barrier;        // this program's barrier word, then its epoch (launches completed since the
                            // words were zeroed) and its count of blocks that finished this launch
  Error* error;
  int32_t num_lists;
  uint32_t num_barriers;
  int32_t program;          // index of the program in the manifest (for error reports)
  uint32_t pad_;
  unsigned long long timeout_ns;
  const void* tmaps;        // this program's encoded tensor maps (CUtensorMap, 128 bytes each)
};

// What a body function receives (on the consumer threads 0..LATCH_THREADS-1, or, for a body with
// a producer half, on the producer thread: see latch_kernel_main.cuh).
struct Ctx {
  const Task* t;
  char* const* ops;
  char* smem;             // the body's scratch shared memory (LATCH_SCRATCH_BYTES, not the ring)
  const char* tmaps;      // Args::tmaps + 128 * t->tmap: the group's tensor maps, in order
  Pipe pipe;              // the ring, positioned where this task's first stage is
  const long long* args;  // the body's run-time constants (its row of latch_body_args)
  // Set (to 1, by every consumer thread) by a body that returns with TMA stores still in flight
  // (latch_gemm.cuh GemmStoreTma): lane 0 of each consumer warp holds them in its bulk groups, and
  // the worker (latch_kernel_main.cuh) waits for them before the task counts as finished.
  mutable int async_stores = 0;
};

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void red_release(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ int ld_volatile(const int32_t* p) { return *(volatile const int32_t*)p; }

__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- four consecutive elements in the GLOBAL state space (the generated memory-bound bodies) -----
// latch::ld4/st4 go through generic addresses (the operand pointers come from the task table), which
// compile to LD.E.128 / ST.E.128; these tell the compiler the address is global (__isGlobal), so
// they compile to the plain weak LDG.E.128 / STG.E.128 (.64 for 2-byte types): the accesses every
// ordinary CUDA kernel makes. (``__ldca``/``__stwb`` would give LDG/STG .STRONG.SM: CTA-scope
// relaxed accesses, ordered where weak ones need not be.) Coherence across SMs is the same either
// way: the grid barrier's and the counters' acquire order them. ``p + i`` must be aligned to
// 4 * sizeof(S) bytes.
// Elements from ``p`` to the next address aligned for ld4/st4 (0..3).
template <class S> __device__ __forceinline__ long long peel4(const S* p) {
  constexpr uintptr_t A = 4 * sizeof(S);
  return (long long)(((A - (reinterpret_cast<uintptr_t>(p) & (A - 1))) & (A - 1)) / sizeof(S));
}
template <class S> __device__ __forceinline__ void gld4(const S* p, i64 i, typename Compute<S>::type (&r)[4]) {
  ld4(p, i, r);
}
template <> __device__ __forceinline__ void gld4<float>(const float* p, i64 i, float (&r)[4]) {
  const float* a = p + i;
  __builtin_assume(__isGlobal(a));
  const float4 q = *reinterpret_cast<const float4*>(a);
  r[0] = q.x; r[1] = q.y; r[2] = q.z; r[3] = q.w;
}
template <> __device__ __forceinline__ void gld4<__nv_bfloat16>(const __nv_bfloat16* p, i64 i, float (&r)[4]) {
  const __nv_bfloat16* a = p + i;
  __builtin_assume(__isGlobal(a));
  const uint2 q = *reinterpret_cast<const uint2*>(a);
  const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.x));
  const float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.y));
  r[0] = x.x; r[1] = x.y; r[2] = y.x; r[3] = y.y;
}
template <class S, class V> __device__ __forceinline__ void gst4(S* p, i64 i, const V (&v)[4]) {
  if constexpr (sizeof(S) == 4 && std::is_same<S, float>::value) {
    float* a = p + i;
    __builtin_assume(__isGlobal(a));
    *reinterpret_cast<float4*>(a) = make_float4((float)v[0], (float)v[1], (float)v[2], (float)v[3]);
  } else if constexpr (std::is_same<S, __nv_bfloat16>::value) {
    const __nv_bfloat162 x = __floats2bfloat162_rn((float)v[0], (float)v[1]);
    const __nv_bfloat162 y = __floats2bfloat162_rn((float)v[2], (float)v[3]);
    uint2 q;
    q.x = *reinterpret_cast<const unsigned*>(&x);
    q.y = *reinterpret_cast<const unsigned*>(&y);
    __nv_bfloat16* a = p + i;
    __builtin_assume(__isGlobal(a));
    *reinterpret_cast<uint2*>(a) = q;
  } else {
    st4(p, i, v);
  }
}

// An L2 prefetch of the line holding p + i (the flat vector loop's batches ahead: flat.py).
// ``prefetch.global.L2`` (SASS CCTL.E.PF2) is a hint: it writes no register and fills no L1, so
// a thread can have lines requested far ahead of its register loads at no register cost (the
// loop's registers are what bounds its own loads in flight). The operand pointers are generic
// (from the task table): converted to the global window first, as the .global space requires.
// Callers keep p + i inside the operand's range: no address past the data a task owns is touched.
template <class S> __device__ __forceinline__ void gpf(const S* p, i64 i) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(p + i)));
}
// The L2 prefetch of the line holding the group of four elements p + i .. p + i + 3, issued only by
// the thread whose group opens the line (its first byte is the line's: groups are aligned to their
// size, 4 * sizeof(S) <= 128, so no group straddles a line). Where each line's groups are spread
// over threads in an order the generator does not know (a view's index map: fuse.py's row-tile
// path, the short reductions of lower_reduce.py), this requests every line whose first group some
// thread prefetches exactly once, with no lane arithmetic; a line whose first group is outside the
// range prefetched is skipped (the prefetch is a hint: its register loads still read it).
template <class S> __device__ __forceinline__ void gpf4(const S* p, i64 i) {
  if ((reinterpret_cast<uintptr_t>(p + i) & 127) < 4 * sizeof(S)) gpf(p, i);
}

}  // namespace latch

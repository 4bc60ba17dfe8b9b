// The megakernel's ring of shared-memory stages as an op body sees it. The worker
// (latch_codegen_h100/cuda/latch_kernel_main.cuh) owns the memory and the mbarriers, sets them up
// once per launch, and hands each task a Pipe positioned at the task's first stage; a body with a
// producer half (e.g. latch_gemm.cuh) fills stages on the producer thread and its consumer half
// empties them, both walking the same sequence of stages.
#pragma once

#include <stdint.h>

#include "latch_common.cuh"
#include "latch_sm90.cuh"

namespace latch {

enum PipeError : int { ERR_PIPE_TIMEOUT = 5 };  // also in latch_kernel.cuh's KernelError

__device__ __forceinline__ unsigned long long pipe_clock() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct Pipe {
  char* ring;       // stage s at ring + s * stage_bytes (1024-byte aligned)
  uint64_t* full;   // [stages]: the stage's loads landed (1 arrival + transaction bytes)
  uint64_t* empty;  // [stages]: the stage's readers are done (one arrival per consumer warp)
  int stages, stage_bytes;
  uint32_t stage, phase;  // this role's position; both roles advance it identically
  const volatile int* abort;       // the launch's abort flag (Error::abort)
  unsigned long long timeout_ns;   // a stage that never completes is a bug: report it, do not hang

  __device__ __forceinline__ void advance() {
    if (++stage == (uint32_t)stages) {
      stage = 0;
      phase ^= 1u;
    }
  }
  __device__ __forceinline__ char* at(uint32_t s) const { return ring + (size_t)s * stage_bytes; }
};

// Up to 64 polls of ``bar``'s phase ``parity`` inside one asm block: 1 if it completed.
__device__ __forceinline__ uint32_t mbar_poll(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n\t.reg .pred P1;\n\t.reg .u32 n;\n\tmov.u32 n, 64;\n\tmov.u32 %0, 1;\n\t"
      "LATCH_POLL:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%1], %2;\n\t"
      "@P1 bra LATCH_POLL_DONE;\n\tsub.u32 n, n, 1;\n\tsetp.ne.u32 P1, n, 0;\n\t@P1 bra LATCH_POLL;\n\t"
      "mov.u32 %0, 0;\n\tLATCH_POLL_DONE:\n\t}"
      : "=r"(ok)
      : "r"(sm90::smem_addr(bar)), "r"(parity)
      : "memory");
  return ok;
}

// True when the wait must stop: the launch was aborted, or ``t0`` is older than the timeout (then
// reported as ERR_PIPE_TIMEOUT with the barrier's shared-memory address and the parity).
__device__ __forceinline__ bool pipe_give_up(uint64_t* bar, uint32_t parity, const Pipe& p, unsigned long long t0) {
  if (*p.abort) return true;
  if (pipe_clock() - t0 > p.timeout_ns) {
    latch_report(ERR_PIPE_TIMEOUT, (long long)sm90::smem_addr(bar), (long long)parity);
    return true;
  }
  return false;
}

// Wait (one thread) for ``bar``'s phase ``parity``; false if the launch was aborted meanwhile or the
// wait timed out.
__device__ __forceinline__ bool pipe_wait(uint64_t* bar, uint32_t parity, const Pipe& p) {
  if (mbar_poll(bar, parity)) return true;
  const unsigned long long t0 = pipe_clock();
  for (;;) {
    if (mbar_poll(bar, parity)) return true;
    if (pipe_give_up(bar, parity, p, t0)) return false;
  }
}

// The same, called by every lane of a warp, with one answer for the warp. Waits in front of wgmma
// must look uniform to the compiler: a data-dependent exit from a per-thread loop there makes ptxas
// serialise the warpgroup's wgmma instructions (warning C7518).
__device__ __forceinline__ bool pipe_wait_warp(uint64_t* bar, uint32_t parity, const Pipe& p) {
  if (__all_sync(0xffffffffu, mbar_poll(bar, parity))) return true;
  const unsigned long long t0 = pipe_clock();
  for (;;) {
    if (__all_sync(0xffffffffu, mbar_poll(bar, parity))) return true;
    int stop = 0;
    if ((threadIdx.x & 31) == 0) stop = pipe_give_up(bar, parity, p, t0);
    if (__shfl_sync(0xffffffffu, stop, 0)) return false;
  }
}

}  // namespace latch

// The persistent megakernel and its C ABI. Included once, by the generated kernel.cu, after the
// generated ``latch_dispatch(int body, const latch::Ctx&)`` and the LATCH_MAX_OPERANDS define.
//
// Execution model: one cooperative launch, one block per SM. Block b walks instruction list b
// (blocks past the schedule's lists only take part in the grid barriers). A task instruction loads
// the task record and its operand pointers into shared memory and dispatches to the task's body;
// barriers and counter waits spin with acquire loads and give up after ``timeout_ns``, recording
// who waited on what in the error record and raising ``abort`` so that every other block stops
// too instead of hanging.
//
// Counters and the barrier word are never reset between launches: launch number ``epoch`` of a
// program waits for ``epoch * expected[c] + n`` signals on counter c, and for
// ``(epoch * num_barriers + k + 1) * gridDim.x`` arrivals at barrier k (unsigned, wrap-safe).
//
// Profiling build (compiled with -DLATCH_PROFILE=1; a normal build compiles none of it): the kernel
// takes a second argument, ``prof``, an array of (begin, end) u64 pairs in %globaltimer nanoseconds
// (one clock for every SM, so records of different SMs compare; its update granularity is the
// device's, see latch_codegen_h100.profile). Record ``pc`` (the instruction's index in Args::instrs)
// holds that instruction's interval as thread 0 saw it: a task from before its record is loaded to
// after the block's __syncthreads that ends its body; a barrier or counter wait from arrival to
// release; a signal around its fence and release add. Record ``n_instrs + blockIdx.x`` holds the
// block's entry and its exit (written only when the block finishes its list without an abort).
// Unwritten records stay as the runtime zeroed them. ``prof`` may be null (no records).
#pragma once

#include <cuda_runtime.h>

#include "latch_kernel.cuh"

#ifndef LATCH_MAX_OPERANDS
#error "define LATCH_MAX_OPERANDS before including latch_kernel_main.cuh"
#endif

__device__ latch::Error* latch_error_buffer;
__device__ int latch_current_task[1024];  // per block: the task it is running (for body errors)
__device__ int latch_current_program;     // Args::program of the running launch

extern "C" __device__ void latch_report(int code, long long a, long long b) {
  latch::Error* e = latch_error_buffer;
  if (atomicCAS(&e->code, 0, code) == 0) {
    e->block = blockIdx.x;
    e->pc = -1;
    e->task = latch_current_task[blockIdx.x % 1024];
    e->counter = -1;
    e->program = latch_current_program;
    e->a = a;
    e->b = b;
    __threadfence();
  }
  atomicExch(&e->abort, 1);
}

#ifdef LATCH_PROFILE
#define LATCH_PROF_PARAM , unsigned long long* prof
// Thread 0 takes the begin time; the other threads never use it.
#define LATCH_PROF_BEGIN() const unsigned long long prof_t0 = threadIdx.x == 0 ? latch::globaltimer() : 0ull
#define LATCH_PROF_END(index) \
  if (threadIdx.x == 0 && prof) latch::prof_store(prof, (index), prof_t0, latch::globaltimer())
#else
#define LATCH_PROF_PARAM
#define LATCH_PROF_BEGIN() ((void)0)
#define LATCH_PROF_END(index) ((void)0)
#endif

namespace latch {

#ifdef LATCH_PROFILE
__device__ __forceinline__ void prof_store(unsigned long long* prof, long long index, unsigned long long t0,
                                           unsigned long long t1) {
  reinterpret_cast<ulonglong2*>(prof)[index] = make_ulonglong2(t0, t1);  // one 16-byte store
}
#endif

// Thread 0 spins until *p reaches target (wrap-safe); false when it timed out or another block
// aborted the launch. Every thread of the block gets the same answer.
__device__ __noinline__ bool spin_until(const uint32_t* p, uint32_t target, uint32_t base, const Args& a,
                                        int kind, int pc, int id) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = 1;
    uint32_t v = ld_acquire(p);
    if ((int32_t)(v - target) < 0) {
      unsigned long long t0 = globaltimer();
      unsigned int spins = 0;
      while ((int32_t)((v = ld_acquire(p)) - target) < 0) {
        if ((++spins & 63u) == 0) {
          if (ld_volatile(&a.error->abort)) {
            ok = 0;
            break;
          }
          if (globaltimer() - t0 > a.timeout_ns) {
            Error* e = a.error;
            if (atomicCAS(&e->code, 0, kind) == 0) {
              e->block = blockIdx.x;
              e->pc = pc;
              e->task = latch_current_task[blockIdx.x % 1024];
              e->counter = id;
              e->value = v - base;
              e->target = target - base;
              e->program = a.program;
              __threadfence();
            }
            atomicExch(&e->abort, 1);
            ok = 0;
            break;
          }
        }
        __nanosleep(20);
      }
      __threadfence();
    }
  }
  __syncthreads();
  int r = ok;
  __syncthreads();  // ``ok`` is reused by the next call
  return r;
}

}  // namespace latch

extern "C" __global__ void __launch_bounds__(LATCH_THREADS, 1) latch_kernel(latch::Args a LATCH_PROF_PARAM) {
  using namespace latch;
  extern __shared__ __align__(16) char latch_smem[];
  __shared__ Task task;
  __shared__ char* ops[LATCH_MAX_OPERANDS];
#ifdef LATCH_PROFILE
  const unsigned long long prof_entry = threadIdx.x == 0 ? globaltimer() : 0ull;
  const long long prof_block = (long long)a.sm_begin[a.num_lists] + blockIdx.x;  // after every instruction
#endif

  // Every block writes the same values, so each block sees them before any of its bodies reports.
  if (threadIdx.x == 0) {
    latch_error_buffer = a.error;
    latch_current_program = a.program;
    latch_current_task[blockIdx.x % 1024] = -1;
  }
  __syncthreads();

  const uint32_t grid = gridDim.x;
  if ((int)blockIdx.x >= a.num_lists) {  // spare block: only the grid barriers
    for (uint32_t k = 0; k < a.num_barriers; ++k) {
      const uint32_t base = (a.epoch * a.num_barriers + k) * grid;
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        red_release(a.barrier, 1u);
      }
      if (!spin_until(a.barrier, base + grid, base, a, ERR_BARRIER_TIMEOUT, -1, (int)k)) return;
    }
#ifdef LATCH_PROFILE
    if (threadIdx.x == 0 && prof) prof_store(prof, prof_block, prof_entry, globaltimer());
#endif
    return;
  }

  const int begin = a.sm_begin[blockIdx.x], end = a.sm_begin[blockIdx.x + 1];
  for (int pc = begin; pc < end; ++pc) {
    const Instr ins = a.instrs[pc];
    LATCH_PROF_BEGIN();
    if (ins.kind == I_TASK) {
      if (threadIdx.x == 0) {
        task = a.tasks[ins.a];
        latch_current_task[blockIdx.x % 1024] = ins.a;
      }
      __syncthreads();
      for (int i = threadIdx.x; i < task.op_count; i += blockDim.x) {
        const Operand o = a.operands[task.op_begin + i];
        ops[i] = a.buffers[o.buffer] + o.offset;
      }
      __syncthreads();
      Ctx c{&task, ops, latch_smem};
      latch_dispatch(task.body, c);
      __syncthreads();
      LATCH_PROF_END(pc);
      if (threadIdx.x == 0) latch_current_task[blockIdx.x % 1024] = -1;
      if (ld_volatile(&a.error->abort)) return;  // a body reported an error: stop early
    } else if (ins.kind == I_SIGNAL) {
      if (threadIdx.x == 0) {
        __threadfence();
        red_release(a.counters + ins.a, 1u);
      }
      LATCH_PROF_END(pc);
    } else if (ins.kind == I_WAIT) {
      const uint32_t base = a.epoch * a.expected[ins.a];
      if (!spin_until(a.counters + ins.a, base + (uint32_t)ins.b, base, a, ERR_WAIT_TIMEOUT, pc - begin, ins.a))
        return;
      LATCH_PROF_END(pc);
    } else {  // I_BARRIER
      const uint32_t base = (a.epoch * a.num_barriers + (uint32_t)ins.a) * grid;
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        red_release(a.barrier, 1u);
      }
      if (!spin_until(a.barrier, base + grid, base, a, ERR_BARRIER_TIMEOUT, pc - begin, ins.a)) return;
      LATCH_PROF_END(pc);
    }
  }
#ifdef LATCH_PROFILE
  if (threadIdx.x == 0 && prof) prof_store(prof, prof_block, prof_entry, globaltimer());
#endif
}

// ---------------------------------------------------------------------------------------------
// C ABI (ctypes). Every function returns a cudaError_t value (0 = success).

extern "C" {

int latch_abi_version(void) { return LATCH_ABI_VERSION; }

int latch_num_bodies(void) { return LATCH_NUM_BODIES; }

int latch_max_operands(void) { return LATCH_MAX_OPERANDS; }

const char* latch_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

int latch_device_info(int device, int* num_sms, int* max_smem_optin, int* major, int* minor) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return (int)e;
  if ((e = cudaDeviceGetAttribute(num_sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return (int)e;
  if ((e = cudaDeviceGetAttribute(max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) != cudaSuccess)
    return (int)e;
  if ((e = cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device)) != cudaSuccess) return (int)e;
  return (int)cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device);
}

// Raise the kernel's dynamic shared memory limit and report how many blocks fit on one SM.
int latch_prepare(int device, long long smem, int* blocks_per_sm, int* num_regs) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return (int)e;
  e = cudaFuncSetAttribute((const void*)latch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return (int)e;
  cudaFuncAttributes attr;
  if ((e = cudaFuncGetAttributes(&attr, (const void*)latch_kernel)) != cudaSuccess) return (int)e;
  *num_regs = attr.numRegs;
  return (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, (const void*)latch_kernel, LATCH_THREADS,
                                                           (size_t)smem);
}

int latch_launch(const latch::Args* args, int device, int grid, long long smem, void* stream) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return (int)e;
#ifdef LATCH_PROFILE
  unsigned long long* prof = nullptr;  // a profiling build launched without a record buffer
  void* params[] = {(void*)args, (void*)&prof};
#else
  void* params[] = {(void*)args};
#endif
  e = cudaLaunchCooperativeKernel((const void*)latch_kernel, dim3(grid), dim3(LATCH_THREADS), params, (size_t)smem,
                                  (cudaStream_t)stream);
  return (int)e;
}

#ifdef LATCH_PROFILE
// Profiling builds only (the runtime finds this symbol to know it has one): like latch_launch, with
// ``prof`` pointing at (sm_begin[num_lists] + grid) zeroed 16-byte records (see the top of this file).
int latch_launch_profile(const latch::Args* args, unsigned long long* prof, int device, int grid, long long smem,
                         void* stream) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return (int)e;
  void* params[] = {(void*)args, (void*)&prof};
  e = cudaLaunchCooperativeKernel((const void*)latch_kernel, dim3(grid), dim3(LATCH_THREADS), params, (size_t)smem,
                                  (cudaStream_t)stream);
  return (int)e;
}
#endif

}  // extern "C"

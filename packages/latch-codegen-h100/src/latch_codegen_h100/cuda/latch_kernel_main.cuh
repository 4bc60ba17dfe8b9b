// The persistent megakernel (the worker) and its C ABI. Included once, by the generated kernel.cu,
// after the generated ``latch_dispatch`` (consumer halves of the bodies), ``latch_produce``
// (producer halves), the table ``latch_body_args`` (LATCH_MAX_ARGS run-time constants per body) and
// the defines LATCH_MAX_OPERANDS, LATCH_NUM_BODIES, LATCH_STAGES, LATCH_STAGE_BYTES and
// LATCH_SCRATCH_BYTES.
//
// Execution model (version 2). One cooperative launch, one block of LATCH_BLOCK = 384 threads per
// SM, in two roles with their own register budgets (setmaxnreg):
// - consumers, threads 0..255 (warpgroups 0 and 1, 224 registers each): run the bodies. Every op
//   body is written to these 256 threads (LATCH_THREADS) and synchronises them with
//   latch::block_sync() (named barrier 1), never __syncthreads();
// - the producer, warp 0 of warpgroup 2 (56 registers; the other three warps exit at once): walks
//   block b's instruction list (Args::instrs from sm_begin[b]), waits on dataflow counters, hands
//   every task, signal and barrier to the consumers through a queue of LATCH_QUEUE slots in shared
//   memory, and, for a body with a producer half (a task with tensor maps: Task::tmap >= 0),
//   issues that task's TMA loads into the kernel's ring of LATCH_STAGES stages right after handing
//   the task over. So the next task's first loads overlap the current task's math and epilogue:
//   the producer runs ahead by up to LATCH_QUEUE items and LATCH_STAGES stages.
// Ticketed phases (latch_codegen_h100.tickets, schedule option ``tickets``): where a barrier
// phase's tasks were, every list holds one I_TICKET (a = counter, b = the queue's first task
// instruction, after the lists in Args::instrs, c = its length). The producer takes ticket
// t = atomicAdd(counter) - epoch * expected and hands queue task t over, until t >= c; it takes a
// ticket only while at most one item waits in the queue beside the consumers' (a task held early is
// one another SM could have run). No two tasks of a ticketed phase conflict (tickets.py), so any SM
// may run any of them; the counter, like the others, is never reset (each launch adds c + lists).
// The queue hand-off (results/rq.md): slot q has two hardware named barriers over both roles'
// LATCH_SLOT_THREADS threads, FULL(q) and EMPTY(q). The producer, for item i in slot q = i mod
// LATCH_QUEUE: bar.sync EMPTY(q) if i >= LATCH_QUEUE (the consumers released item i - LATCH_QUEUE),
// writes the slot, and every producer lane bar.arrive FULL(q) (no wait); the consumers bar.sync
// FULL(q), read the slot (their bodies read the task record and operand pointers in it), and every
// consumer thread bar.arrive EMPTY(q) when it no longer reads it. A completed barrier orders every
// participant's earlier shared-memory accesses before every participant's later ones (and
// compute-sanitizer racecheck models it; it does not model mbarrier arrive/wait for ordinary
// shared-memory stores). Named barriers have no timeout, so neither role leaves the protocol early:
// a failing producer hands over an end item, aborted consumers keep releasing slots without running
// bodies until they get it, and the producer finally waits for every release still outstanding, so
// no barrier is left half-arrived. Named barrier ids: 0 __syncthreads, 1 the consumers' block_sync,
// 2-3 latch_moe.cuh's per-warpgroup barriers, LATCH_BAR_FULL.. and LATCH_BAR_EMPTY.. the queue's,
// 14-15 latch_gemm_pingpong.cuh's turns (GEMM_PP_TURN + w).
// Shared memory (dynamic): the ring (1024-byte aligned), then LATCH_SCRATCH_BYTES of scratch for
// the bodies (Ctx::smem; never used by the producer, so prefetching never touches it).
//
// Ordering rules the worker keeps:
// - a counter wait is the producer's: it hands the next item over only after the wait, so the
//   consumers' reads are ordered after the producers they wait for (acquire, then the slot's
//   mbarrier), and TMA loads are issued after a proxy fence;
// - a task on the same SM list whose TMA loads read what an earlier task of the list and phase
//   writes waits, before its loads, until the consumers have finished that task (Task::dep counts
//   from the tasks handed over before the list's last grid barrier; ``done`` below: a per-block
//   global word, latch_done_words, release/acquire at CTA scope). Across a barrier nothing is
//   waited for: the consumers complete their stores before they arrive;
//   consumers end every task with a proxy fence so TMA sees what they stored;
// - signals and barrier arrivals are the consumers': after the task(s) before them, after a named
//   barrier of all consumers. The producer passes a grid barrier only once it completed (it spins
//   on the same word without arriving).
// - TMA stores (a body that sets Ctx::async_stores, latch_gemm.cuh GemmStoreTma) may still be in
//   flight when the body returns, so that the next task's math overlaps them. ``done`` counts only
//   tasks whose stores are complete: such a task is counted once a later wait covers its stores
//   (the next TMA-store body's first epilogue waits for every earlier one; ``consumer_flush``, the
//   wait of lane 0 of every consumer warp, before a signal, a barrier, the list's end, a task
//   whose loads depend on the uncounted task (Task::dep), a task without tensor maps (it may read
//   the output with ordinary loads), and after a body without TMA stores).
// Counters and the barrier word are never reset between launches: launch number ``epoch`` of a
// program waits for ``epoch * expected[c] + n`` signals on counter c, and for
// ``(epoch * num_barriers + k + 1) * gridDim.x`` arrivals at barrier k (unsigned, wrap-safe).
// The epoch lives on the device (Args::barrier[1]): thread 0 of every block reads it at entry, and
// the last block to finish (Args::barrier[2] counts them) adds one, so a launch takes no argument
// that changes between launches and a CUDA graph can hold it (replays count epochs like launches).
// Blocks past the schedule's lists only take part in the grid barriers. Every wait gives up after
// ``timeout_ns`` (or when another block aborted), recording who waited on what in the error record.
//
// Profiling build (-DLATCH_PROFILE=1; a normal build compiles none of it): the kernel takes a
// second argument ``prof``, (begin, end) u64 pairs of %globaltimer nanoseconds, all taken by
// consumer thread 0. Record ``pc`` (the instruction's index in Args::instrs) is: a task from the
// consumers taking it off the queue to the end of its body and closing barrier; a counter wait from
// the consumers asking for the next item to receiving it (the producer forwards waits to the queue
// only in this build); a barrier from arrival to release; a signal around its fence and release
// add. Record ``n_instrs + blockIdx.x`` holds the block's entry and exit (written only when the
// block finishes its list without an abort); ``n_instrs`` counts the lists' instructions
// (sm_begin[num_lists]). Queue task i (a ticketed phase's) has record ``n_instrs + grid + i``:
// (begin, duration | block << 40). ``prof`` may be null.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "latch_kernel.cuh"

#ifndef LATCH_MAX_OPERANDS
#error "define LATCH_MAX_OPERANDS before including latch_kernel_main.cuh"
#endif
#ifndef LATCH_STAGES
#define LATCH_STAGES 0
#define LATCH_STAGE_BYTES 0
#endif
#ifndef LATCH_SCRATCH_BYTES
#define LATCH_SCRATCH_BYTES 0
#endif
#ifndef LATCH_TICKETS
#define LATCH_TICKETS 0  // the tables hold no ticketed phase (latch_codegen_h100.tickets)
#endif

#define LATCH_BLOCK (LATCH_THREADS + 128)
#define LATCH_QUEUE 4
#define LATCH_SLOT_THREADS (LATCH_THREADS + 32)  // both roles: the consumers and the producer warp
#define LATCH_BAR_FULL 4                          // named barriers 4 .. 4 + LATCH_QUEUE - 1
#define LATCH_BAR_EMPTY (LATCH_BAR_FULL + LATCH_QUEUE)
#define LATCH_MAX_BLOCKS 1024                     // latch_done_words (the runtime refuses larger grids)
static_assert(LATCH_BAR_EMPTY + LATCH_QUEUE <= 16, "16 named barriers per block");
static_assert(LATCH_BAR_EMPTY + LATCH_QUEUE <= 14, "named barriers 14-15 are the ping-pong body's turns");
#define LATCH_PRODUCER_REGS 56
#define LATCH_CONSUMER_REGS 224
static_assert(LATCH_THREADS == 256, "two consumer warpgroups");
static_assert(128 * LATCH_PRODUCER_REGS + LATCH_THREADS * LATCH_CONSUMER_REGS <= 65536, "register file");

__device__ latch::Error* latch_error_buffer;
__device__ int latch_current_task[1024];  // per block: the task it is running (for body errors)
__device__ int latch_current_program;     // Args::program of the running launch
__shared__ uint32_t latch_epoch;          // this launch's epoch (Args::barrier[1] at entry; see the top)
// Per block (128 bytes apart): tasks of its list the consumers have finished, their stores complete
// (``done``; zeroed by the block at launch). In global memory, written and polled inside the block
// (release/acquire at CTA scope): shared memory would be the same speed but a flag there is a hazard
// to racecheck, which models no acquire/release on shared memory.
__device__ uint32_t latch_done_words[LATCH_MAX_BLOCKS * 32];

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
#define LATCH_PROF_ARG , prof
#else
#define LATCH_PROF_PARAM
#define LATCH_PROF_ARG
#endif

namespace latch {

#ifdef LATCH_PROFILE
__device__ __forceinline__ void prof_store(unsigned long long* prof, long long index, unsigned long long t0,
                                           unsigned long long t1) {
  if (prof) reinterpret_cast<ulonglong2*>(prof)[index] = make_ulonglong2(t0, t1);  // one 16-byte store
}
#endif

// One queue slot: an instruction handed from the producer to the consumers.
struct Slot {
  int32_t kind;  // I_TASK, I_SIGNAL, I_BARRIER, I_WAIT (profiling builds only), or 0: the list ended
  int32_t arg;   // Instr::a (task id, counter, barrier index)
  int32_t pc;    // index in Args::instrs
  uint32_t ring; // the ring position of the task's first stage: stage | phase << 31
  Task task;
  char* ops[LATCH_MAX_OPERANDS];
};

struct __align__(16) WorkerShared {  // (16: the consumers read a slot in 16-byte loads)
  Slot slot[LATCH_QUEUE];  // handed over through named barriers LATCH_BAR_FULL + q / LATCH_BAR_EMPTY + q
  uint64_t stage_full[LATCH_STAGES > 0 ? LATCH_STAGES : 1], stage_empty[LATCH_STAGES > 0 ? LATCH_STAGES : 1];
};

// Arrive at named barrier ``id`` (``threads`` in all) without waiting; with ``bar.sync`` of the
// other participants it orders this thread's earlier memory accesses before their later ones.
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ uint32_t* done_word() { return &latch_done_words[(blockIdx.x % LATCH_MAX_BLOCKS) * 32]; }
__device__ __forceinline__ void st_release_cta(uint32_t* p, uint32_t v) {
  asm volatile("st.release.cta.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_cta(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.cta.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ Pipe make_pipe(WorkerShared& S, char* ring, const Args& a, uint32_t pos) {
  Pipe p;
  p.ring = ring;
  p.full = S.stage_full;
  p.empty = S.stage_empty;
  p.stages = LATCH_STAGES;
  p.stage_bytes = LATCH_STAGE_BYTES;
  p.stage = pos & 0x7fffffffu;
  p.phase = pos >> 31;
  p.abort = &a.error->abort;
  p.timeout_ns = a.timeout_ns;
  return p;
}

// One thread spins until *p reaches target (wrap-safe); false when it timed out (recorded as
// ``kind`` with the instruction, counter and values) or another block aborted the launch. Inlined:
// the producer calls it, and ptxas cannot allocate one out-of-line function for both register budgets.
__device__ __forceinline__ bool spin_until(const uint32_t* p, uint32_t target, uint32_t base, const Args& a, int kind,
                                        int pc, int id) {
  uint32_t v = ld_acquire(p);
  if ((int32_t)(v - target) >= 0) return true;
  const unsigned long long t0 = globaltimer();
  for (unsigned spins = 1;; ++spins) {
    __nanosleep(20);
    if ((int32_t)((v = ld_acquire(p)) - target) >= 0) return true;
    if ((spins & 63u) == 0) {
      if (ld_volatile(&a.error->abort)) return false;
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
        return false;
      }
    }
  }
}

// Wait (one thread) until every block arrived at grid barrier k of this launch: the barrier word
// holds (epoch * num_barriers + k + 1) * gridDim.x arrivals then.
__device__ __forceinline__ bool barrier_complete(const Args& a, uint32_t k, int pc) {
  const uint32_t grid = gridDim.x;
  const uint32_t base = (latch_epoch * a.num_barriers + k) * grid;
  return spin_until(a.barrier, base + grid, base, a, ERR_BARRIER_TIMEOUT, pc, (int)k);
}

// The consumers' grid barrier k: every consumer thread has finished the work before it (the named
// barrier), thread 0 arrives and waits, then every consumer thread leaves together.
__device__ __forceinline__ bool consumer_grid_barrier(const Args& a, uint32_t k, int pc) {
  block_sync();
  bool failed = false;
  if (threadIdx.x == 0) {
    __threadfence();
    red_release(a.barrier, 1u);
    failed = !barrier_complete(a, k, pc);
  }
  return !sm90::named_sync_or(1, LATCH_THREADS, failed);
}

// ---- the producer (one warp; lane 0 does the waiting and issues the loads) ------------------------
constexpr int TASK_WORDS = (int)(sizeof(Task) / 4);
static_assert(TASK_WORDS <= 32 && offsetof(Task, op_begin) == 16 && offsetof(Task, op_count) == 20 &&
                  offsetof(Task, tmap) == 24, "one task word per lane");

__device__ __forceinline__ Instr instr_at(const Args& a, int pc, int end) {
  Instr ins{0, 0, 0, 0};  // past the end: tell the consumers the list is over
  if (pc < end) ins = a.instrs[pc];
  return ins;
}
// Lane ``lane``'s word of the task record of ``ins`` (0 when it is not a task).
__device__ __forceinline__ int32_t task_word(const Args& a, const Instr& ins, int lane) {
  return ins.kind == I_TASK && lane < TASK_WORDS ? reinterpret_cast<const int32_t*>(a.tasks + ins.a)[lane] : 0;
}
// Lane ``lane``'s operand record of that task (the first 32); every lane must call it.
__device__ __forceinline__ Operand task_operand(const Args& a, const Instr& ins, int32_t word, int lane) {
  const int ob = __shfl_sync(0xffffffffu, word, 4), oc = __shfl_sync(0xffffffffu, word, 5);
  Operand o{0, 0, 0};
  if (ins.kind == I_TASK && lane < oc) o = a.operands[ob + lane];
  return o;
}

// Wait until the consumers released item ``released`` (the producer's count of items whose release
// it has waited for; items are released in order, item i through EMPTY(i % LATCH_QUEUE)).
__device__ __forceinline__ void await_release(uint32_t& released) {
  sm90::named_sync(LATCH_BAR_EMPTY + (int)(released % LATCH_QUEUE), LATCH_SLOT_THREADS);
  ++released;
}

// Hand the end of the list (kind 0) over in slot ``q`` (every producer lane calls it), then wait
// until the consumers released every other item still outstanding: afterwards no queue barrier is
// half-arrived (the consumers arrive at none for the end item).
__device__ __forceinline__ void producer_finish(WorkerShared& S, int q, uint32_t handed, uint32_t released) {
  while (released + LATCH_QUEUE <= handed) await_release(released);
  if ((threadIdx.x & 31) == 0) {
    Slot& s = S.slot[q];
    s.kind = 0;
    s.arg = 0;
    s.pc = -1;
    s.ring = 0;
  }
  named_arrive(LATCH_BAR_FULL + q, LATCH_SLOT_THREADS);
  // Items released .. handed - 1 (before the end item) are released by the consumers later.
  while (released < handed) await_release(released);
}

// Write item ``ins`` into slot ``q`` (its task record and operand pointers for a task) and hand it
// to the consumers; every producer lane calls it, once slot q is free.
__device__ __forceinline__ Slot& hand_over(const Args& a, WorkerShared& S, const Pipe& p, const Instr& ins,
                                           int32_t word, const Operand& opnd, int item_pc, int& q, uint32_t& handed) {
  const int lane = threadIdx.x & 31;
  Slot& s = S.slot[q];
  if (ins.kind == I_TASK) {
    if (lane < TASK_WORDS) reinterpret_cast<int32_t*>(&s.task)[lane] = word;
    __syncwarp();
    const int ob = s.task.op_begin, oc = s.task.op_count;
    if (lane < oc) s.ops[lane] = a.buffers[opnd.buffer] + opnd.offset;
    for (int i = lane + 32; i < oc; i += 32) {
      const Operand o = a.operands[ob + i];
      s.ops[i] = a.buffers[o.buffer] + o.offset;
    }
  }
  if (lane == 0) {
    s.kind = ins.kind;
    s.arg = ins.a;
    s.pc = item_pc;
    s.ring = p.stage | (p.phase << 31);
  }
  __syncwarp();  // (lane 0 reads the whole record below)
  named_arrive(LATCH_BAR_FULL + q, LATCH_SLOT_THREADS);  // every lane: each releases its own stores
  ++handed;
  if (++q == LATCH_QUEUE) q = 0;
  return s;
}

// Lane 0: a task's producer half (its TMA loads into the ring), after waiting until this block's
// consumers have finished ``done_target`` tasks where the task reads what one of them writes
// (Task::dep >= 0). False when that wait timed out (recorded) or the launch was aborted.
__device__ __forceinline__ int produce_task(const Args& a, Slot& s, Pipe& p, uint32_t done_target) {
  if (s.task.dep >= 0) {  // read-after-write on this SM: wait for the consumers to finish the writer
    const unsigned long long t0 = globaltimer();
    while ((int32_t)(ld_acquire_cta(done_word()) - done_target) < 0) {
      if (ld_volatile(&a.error->abort)) return 0;
      if (globaltimer() - t0 > a.timeout_ns) {
        latch_report(ERR_PIPE_TIMEOUT, -1, s.task.dep);
        return 0;
      }
    }
    sm90::fence_proxy_async_global();
  }
  Ctx c{&s.task, s.ops, nullptr, (const char*)a.tmaps + 128ll * s.task.tmap, p,
        latch_body_args + LATCH_MAX_ARGS * s.task.body};
  return latch_produce(s.task.body, c, p);
}

// A dataflow wait (lane 0 spins, every lane learns the result): false when it timed out (recorded).
__device__ __forceinline__ bool counter_wait(const Args& a, const Instr& ins, int pc) {
  int ok = 1;
  if ((threadIdx.x & 31) == 0) {
    const uint32_t base = latch_epoch * a.expected[ins.a];
    ok = spin_until(a.counters + ins.a, base + (uint32_t)ins.b, base, a, ERR_WAIT_TIMEOUT, pc, ins.a);
    sm90::fence_proxy_async_global();
  }
  return __shfl_sync(0xffffffffu, ok, 0) != 0;
}

#if LATCH_TICKETS
// Two producers over the helpers above; a kernel compiles one. With ticketed phases (codegen defines
// LATCH_TICKETS 1): Task::dep counts from the list's last grid barrier, the release count is its own
// register, and the list is not read ahead. Without (the #else): the read-ahead producer, Task::dep
// counted from the list's start. One producer with both paths spilled 52-92 bytes of its 56
// registers in builds with TMA producer halves (results/lead8.md).
__device__ __forceinline__ void producer(const Args& a, WorkerShared& S, char* ring) {
  const int lane = threadIdx.x & 31;
  const int begin = a.sm_begin[blockIdx.x], end = a.sm_begin[blockIdx.x + 1];
  Pipe p = make_pipe(S, ring, a, 0);  // (its abort flag and timeout also serve the dependency wait)
  int q = 0;
  uint32_t handed = 0;  // items handed over so far (item i goes into slot i % LATCH_QUEUE)
  // No read-ahead here (it would not fit the producer's 56 registers beside the ticket's): each
  // instruction's records are loaded when it comes; the queue of LATCH_QUEUE items hides that
  // latency whenever the consumers are busy.
  uint32_t released = 0;  // items whose release by the consumers the producer has waited for
  uint32_t phase0 = 0;    // this list's tasks finished before its last grid barrier (Task::dep counts from there)
  for (int pc = begin; pc <= end;) {
    Instr ins = instr_at(a, pc, end);
    int item_pc = pc;
    if (ins.kind == I_TICKET) {
      // A ticketed phase (tickets.py): take the next task of queue (b, c) from counter a. At most
      // one task waits in the queue beside the one the consumers run: a ticket taken early is a
      // task another SM could have run.
      while (released + 1 < handed) await_release(released);
      uint32_t t = 0;
      if (lane == 0) t = atomicAdd(a.counters + ins.a, 1u) - latch_epoch * a.expected[ins.a];
      t = __shfl_sync(0xffffffffu, t, 0);
      if (t >= (uint32_t)ins.c) {  // drained: on to the barrier
        ++pc;
        continue;
      }
      item_pc = ins.b + (int)t;
      ins = a.instrs[item_pc];
    } else {
      ++pc;
    }
    const int32_t word = task_word(a, ins, lane);
    const Operand opnd = task_operand(a, ins, word, lane);
    int ok = 1;
    if (ins.kind == I_WAIT) {
      if (!counter_wait(a, ins, item_pc - begin)) break;
#ifndef LATCH_PROFILE
      continue;  // the consumers' next item is handed over after the wait: they need not see it
#endif
    }
    if (ins.kind == 0) break;  // the list's end: producer_finish hands it over
    // Slot q is free once the consumers released the item it held (LATCH_QUEUE items ago).
    while (released + LATCH_QUEUE <= handed) await_release(released);
    Slot& s = hand_over(a, S, p, ins, word, opnd, item_pc, q, handed);
    if (ins.kind == I_TASK && s.task.tmap >= 0) {
      // Task::dep counts from the last barrier here
      if (lane == 0) ok = produce_task(a, s, p, phase0 + (uint32_t)s.task.dep + 1u);
      if (!__shfl_sync(0xffffffffu, ok, 0)) break;
    } else if (ins.kind == I_BARRIER) {
      if (lane == 0) {
        ok = barrier_complete(a, (uint32_t)ins.a, item_pc - begin);
        sm90::fence_proxy_async_global();
      }
      if (!__shfl_sync(0xffffffffu, ok, 0)) break;
      // every task before the barrier is finished, its stores complete and counted: the consumers
      // published their count (consumer_flush) before they arrived
      if (lane == 0) phase0 = ld_acquire_cta(done_word());
    }
  }
  // The end of the list, or a failed wait (recorded; the launch is aborted): either way the
  // consumers get an end item, and the queue's barriers are left complete.
  producer_finish(S, q, handed, released);
}

#else
__device__ __forceinline__ void producer(const Args& a, WorkerShared& S, char* ring) {
  const int lane = threadIdx.x & 31;
  const int begin = a.sm_begin[blockIdx.x], end = a.sm_begin[blockIdx.x + 1];
  const char* tmaps = (const char*)a.tmaps;
  Pipe p = make_pipe(S, ring, a, 0);  // (its abort flag and timeout also serve the dependency wait)
  int q = 0;
  uint32_t handed = 0;  // items handed over so far (item i goes into slot i % LATCH_QUEUE)
  // The list is read ahead: each link of the chain instruction -> task record -> operand records
  // is loaded one iteration (one task's TMA issue) before it is needed, so the dependent global
  // loads do not stand between one task's last TMA load and the next task's first.
  // i0, w0, o0: item pc; i1, w1: pc + 1; i2: pc + 2.
  Instr i0 = instr_at(a, begin, end), i1 = instr_at(a, begin + 1, end), i2 = instr_at(a, begin + 2, end);
  int32_t w0 = task_word(a, i0, lane), w1 = task_word(a, i1, lane);
  Operand o0 = task_operand(a, i0, w0, lane);
  for (int pc = begin; pc <= end; ++pc) {
    const Instr ins = i0;
    const int32_t word = w0;
    const Operand opnd = o0;
    {
      const Instr i3 = instr_at(a, pc + 3, end);
      const int32_t w2 = task_word(a, i2, lane);
      const Operand o1 = task_operand(a, i1, w1, lane);
      if (i1.kind == I_TASK) {  // the next task's tensor maps into the descriptor cache
        const int tm = __shfl_sync(0xffffffffu, w1, 6);
        if (tm >= 0 && lane < 2) sm90::tma_prefetch_map(tmaps + 128ll * (tm + lane));
      }
      i0 = i1;
      i1 = i2;
      i2 = i3;
      w0 = w1;
      w1 = w2;
      o0 = o1;
    }
    int ok = 1;
    if (ins.kind == I_WAIT) {
      if (!counter_wait(a, ins, pc - begin)) break;
#ifndef LATCH_PROFILE
      continue;  // the consumers' next item is handed over after the wait: they need not see it
#endif
    }
    if (ins.kind == 0) break;  // the list's end: producer_finish hands it over
    // Slot q is free once the consumers released the item it held (LATCH_QUEUE items ago).
    if (handed >= LATCH_QUEUE) sm90::named_sync(LATCH_BAR_EMPTY + q, LATCH_SLOT_THREADS);
    Slot& s = hand_over(a, S, p, ins, word, opnd, pc, q, handed);
    if (ins.kind == I_TASK && s.task.tmap >= 0) {
      if (lane == 0) ok = produce_task(a, s, p, (uint32_t)(s.task.dep + 1));
      if (!__shfl_sync(0xffffffffu, ok, 0)) break;
    } else if (ins.kind == I_BARRIER) {
      if (lane == 0) {
        ok = barrier_complete(a, (uint32_t)ins.a, pc - begin);
        sm90::fence_proxy_async_global();
      }
      if (!__shfl_sync(0xffffffffu, ok, 0)) break;
    }
  }
  // The end of the list, or a failed wait (recorded; the launch is aborted): either way the
  // consumers get an end item, and the queue's barriers are left complete.
  // (item i waited for item i - LATCH_QUEUE's release: items before handed - LATCH_QUEUE are released)
  producer_finish(S, q, handed, handed > LATCH_QUEUE ? handed - LATCH_QUEUE : 0);
}

#endif  // LATCH_TICKETS

// ---- the consumers (threads 0..LATCH_THREADS-1) -------------------------------------------------------
// Wait until the TMA stores the consumer warps' bulk groups hold are complete and visible to the
// generic proxy, then count every finished task as done (``pending``: the last finished task may
// have stores in flight; uniform over the consumers).
__device__ __forceinline__ void consumer_flush(bool& pending, uint32_t done, uint32_t& published) {
  if (!pending) return;
  if ((threadIdx.x & 31) == 0) {
    sm90::bulk_wait<0>();
    sm90::fence_proxy_async_global();
  }
  block_sync();
  if (threadIdx.x == 0) st_release_cta(done_word(), done);
  published = done;
  pending = false;
}

// The consumers of one block, over its list; false when the launch was aborted.
__device__ __forceinline__ bool consumers(const Args& a, WorkerShared& S, char* ring, char* scratch LATCH_PROF_PARAM) {
  const int tid = threadIdx.x;
  const int begin = a.sm_begin[blockIdx.x];
  const char* tmaps = (const char*)a.tmaps;
  int q = 0;
  uint32_t done = 0, published = 0;
  bool pending = false;  // the last finished task may have TMA stores in flight (then published = done - 1)
  bool aborted = false;  // the launch was aborted: release every slot, run nothing, until the end item
#ifdef LATCH_PROFILE
  const unsigned long long entry = tid == 0 ? globaltimer() : 0ull;
  // read once: a global load per task between its end stamp and the next task's start stamp was
  // +0.16 us on every gap of run 32's profile (0.32 -> 0.48 us median against run 29)
  const int lists_end = a.sm_begin[a.num_lists];
#endif
  for (;; q = q + 1 == LATCH_QUEUE ? 0 : q + 1) {
#ifdef LATCH_PROFILE
    const unsigned long long t_ask = tid == 0 ? globaltimer() : 0ull;
#endif
    sm90::named_sync(LATCH_BAR_FULL + q, LATCH_SLOT_THREADS);  // the producer wrote item i into slot q
    const Slot& s = S.slot[q];
    const int kind = s.kind;
    const int pc = s.pc;
#ifdef LATCH_PROFILE
    const unsigned long long t_got = tid == 0 ? globaltimer() : 0ull;
#endif
    if (kind == 0) {  // (no release: the producer waits for none)
      consumer_flush(pending, done, published);
      break;
    }
    if (aborted) {
      named_arrive(LATCH_BAR_EMPTY + q, LATCH_SLOT_THREADS);
      continue;
    }
    if (kind == I_TASK) {
      if (pending && (s.task.tmap < 0 || s.task.dep >= (int)published)) consumer_flush(pending, done, published);
      if (tid == 0) latch_current_task[blockIdx.x % 1024] = s.task.task;
      const char* maps = s.task.tmap >= 0 ? tmaps + 128ll * s.task.tmap : nullptr;
      Ctx c{&s.task, s.ops, scratch, maps, make_pipe(S, ring, a, s.ring), latch_body_args + LATCH_MAX_ARGS * s.task.body};
      latch_dispatch(s.task.body, c);
      sm90::fence_proxy_async_global();  // a later TMA load may read what this task stored
      // (The abort flag loaded before the body and used after it would overlap its L2 round trip with
      // the body, but a value live across the body call costs the out-of-line bodies a callee-saved
      // register: the head-dim-128 mma forward spilled 4 bytes, results/lead9.md.)
      if (sm90::named_sync_or(1, LATCH_THREADS, ld_volatile(&a.error->abort) != 0)) {
        aborted = true;
        named_arrive(LATCH_BAR_EMPTY + q, LATCH_SLOT_THREADS);
        continue;
      }
      ++done;
      if (c.async_stores) {  // it waited for every earlier store (its first TMA epilogue); its own are in flight
        pending = true;
        published = done - 1;
      } else {
        consumer_flush(pending, done, published);  // (an earlier task's stores; nothing when none)
        published = done;
      }
      named_arrive(LATCH_BAR_EMPTY + q, LATCH_SLOT_THREADS);  // the body no longer reads the slot
      if (tid == 0) {
        st_release_cta(done_word(), published);
        latch_current_task[blockIdx.x % 1024] = -1;
#ifdef LATCH_PROFILE
        const unsigned long long t_end = globaltimer();
        if (pc < lists_end) {
          prof_store(prof, pc, t_got, t_end);
        } else {  // a queue task (a ticketed phase): after the block records, with the block that ran it
          prof_store(prof, (long long)lists_end + gridDim.x + (pc - lists_end), t_got,
                     (t_end - t_got) | ((unsigned long long)blockIdx.x << 40));
        }
#endif
      }
    } else if (kind == I_SIGNAL) {
      const int counter = s.arg;
      named_arrive(LATCH_BAR_EMPTY + q, LATCH_SLOT_THREADS);
      consumer_flush(pending, done, published);
      if (tid == 0) {  // (the tasks before it ended with a barrier of every consumer: their writes precede this)
        __threadfence();
        red_release(a.counters + counter, 1u);
#ifdef LATCH_PROFILE
        prof_store(prof, pc, t_got, globaltimer());
#endif
      }
    } else if (kind == I_BARRIER) {
      const uint32_t k = (uint32_t)s.arg;
      named_arrive(LATCH_BAR_EMPTY + q, LATCH_SLOT_THREADS);
      consumer_flush(pending, done, published);
      if (!consumer_grid_barrier(a, k, pc - begin)) {
        aborted = true;
        continue;
      }
#ifdef LATCH_PROFILE
      if (tid == 0) prof_store(prof, pc, t_got, globaltimer());
#endif
    } else {  // I_WAIT (profiling builds): the time the consumers waited for what came after it
      named_arrive(LATCH_BAR_EMPTY + q, LATCH_SLOT_THREADS);
#ifdef LATCH_PROFILE
      if (tid == 0) prof_store(prof, pc, t_ask, t_got);
#endif
    }
  }
#ifdef LATCH_PROFILE
  if (tid == 0 && !aborted) prof_store(prof, (long long)lists_end + blockIdx.x, entry, globaltimer());
#endif
  return !aborted;
}

// Thread 0 of a block whose part of the launch is done (its last read of the epoch word was at
// entry): the last block of the grid to come here zeroes the count and advances the epoch, which
// the next launch, ordered after this one, reads. An aborted launch advances nothing (the runtime
// zeroes every word after reading its error record).
__device__ __forceinline__ void launch_exit(const Args& a) {
  if (atomicAdd(a.barrier + 2, 1u) == gridDim.x - 1) {
    a.barrier[2] = 0;
    a.barrier[1] += 1;
  }
}

}  // namespace latch

extern "C" __global__ void __launch_bounds__(LATCH_BLOCK, 1) latch_kernel(latch::Args a LATCH_PROF_PARAM) {
  using namespace latch;
  extern __shared__ __align__(1024) char latch_dynamic_smem[];
  __shared__ WorkerShared S;
  // The ring needs 1024-byte alignment (128-byte swizzle atoms); the launch adds 1024 bytes for it.
  char* ring = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(latch_dynamic_smem) + 1023) & ~uintptr_t(1023));
  char* scratch = ring + (size_t)LATCH_STAGES * LATCH_STAGE_BYTES;

  // Every block writes the same values, so each block sees them before any of its bodies reports.
  if (threadIdx.x == 0) {
    latch_error_buffer = a.error;
    latch_current_program = a.program;
    latch_current_task[blockIdx.x % 1024] = -1;
    for (int i = 0; i < LATCH_STAGES; ++i) {
      sm90::mbar_init(&S.stage_full[i], 1);
      sm90::mbar_init(&S.stage_empty[i], LATCH_THREADS / 32);
    }
    *done_word() = 0;  // (the producer reads it only after the __syncthreads below)
    latch_epoch = *reinterpret_cast<volatile uint32_t*>(a.barrier + 1);
    sm90::mbar_init_fence();
  }
  __syncthreads();  // the last barrier of the whole block: from here on the roles meet only at the queue's

  const bool spare = (int)blockIdx.x >= a.num_lists;
  if (threadIdx.x >= LATCH_THREADS) {
    sm90::regs_shrink<LATCH_PRODUCER_REGS>();
    if (!spare && threadIdx.x < LATCH_THREADS + 32) producer(a, S, ring);
    return;
  }
  sm90::regs_grow<LATCH_CONSUMER_REGS>();
  if (spare) {  // only the grid barriers
#ifdef LATCH_PROFILE
    const unsigned long long entry = threadIdx.x == 0 ? globaltimer() : 0ull;
#endif
    for (uint32_t k = 0; k < a.num_barriers; ++k)
      if (!consumer_grid_barrier(a, k, -1)) return;
#ifdef LATCH_PROFILE
    if (threadIdx.x == 0) prof_store(prof, (long long)a.sm_begin[a.num_lists] + blockIdx.x, entry, globaltimer());
#endif
    if (threadIdx.x == 0) launch_exit(a);
    return;
  }
  if (consumers(a, S, ring, scratch LATCH_PROF_ARG) && threadIdx.x == 0) launch_exit(a);
}

// ---------------------------------------------------------------------------------------------
// C ABI (ctypes). Every function returns a cudaError_t value (0 = success) unless it says otherwise.

namespace latch {

// One tensor map to encode at load time (mirrored by latch_codegen_h100.tables.TMAP): the tensor is
// buffer ``buffer`` + ``offset`` bytes; dims innermost first; strides[i] is the byte stride of
// dim i + 1; box the TMA box; codes are CUtensorMapDataType and CUtensorMapSwizzle values.
struct TmapSpec {
  int32_t buffer, dtype;
  int64_t offset;
  int32_t rank, swizzle;
  int64_t dims[3];
  int64_t strides[2];
  int32_t box[3];
  int32_t pad;
};
static_assert(sizeof(TmapSpec) == 80, "TmapSpec layout");

}  // namespace latch

extern "C" {

int latch_abi_version(void) { return LATCH_ABI_VERSION; }

int latch_num_bodies(void) { return LATCH_NUM_BODIES; }

int latch_max_operands(void) { return LATCH_MAX_OPERANDS; }

int latch_block_threads(void) { return LATCH_BLOCK; }

// The largest grid the kernel supports (latch_done_words has one word per block).
int latch_max_blocks(void) { return LATCH_MAX_BLOCKS; }

// The kernel's dynamic shared memory: the ring, the bodies' scratch, and 1024 bytes of alignment.
long long latch_dynamic_smem(void) { return (long long)LATCH_STAGES * LATCH_STAGE_BYTES + LATCH_SCRATCH_BYTES + 1024; }

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
  return (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, (const void*)latch_kernel, LATCH_BLOCK,
                                                           (size_t)smem);
}

// Encode ``n`` tensor maps into ``out`` (host memory, 128 bytes each) with the buffers' device
// addresses ``buffers`` (as in Args::buffers). Returns 0, or 1000 + i when map i was refused by
// the driver (its CUresult in *detail), or -1 when the driver has no cuTensorMapEncodeTiled.
int latch_encode_tmaps(const latch::TmapSpec* specs, int n, const long long* buffers, void* out, int* detail) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (!encode) {
    cudaDriverEntryPointQueryResult q;
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn)
      return -1;
    encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
  }
  for (int i = 0; i < n; ++i) {
    const latch::TmapSpec& s = specs[i];
    cuuint64_t dims[3], strides[2];
    cuuint32_t box[3], elem[3] = {1, 1, 1};
    for (int d = 0; d < s.rank; ++d) {
      dims[d] = (cuuint64_t)s.dims[d];
      box[d] = (cuuint32_t)s.box[d];
    }
    for (int d = 0; d + 1 < s.rank; ++d) strides[d] = (cuuint64_t)s.strides[d];
    void* addr = (void*)(buffers[s.buffer] + s.offset);
    CUresult r = encode(reinterpret_cast<CUtensorMap*>((char*)out + 128ll * i), (CUtensorMapDataType)s.dtype,
                        (cuuint32_t)s.rank, addr, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        (CUtensorMapSwizzle)s.swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
      *detail = (int)r;
      return 1000 + i;
    }
  }
  return 0;
}

int latch_launch(const latch::Args* args, int device, int grid, long long smem, void* stream) {
  if (grid > LATCH_MAX_BLOCKS) return (int)cudaErrorInvalidConfiguration;  // (the runtime says so first)
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return (int)e;
#ifdef LATCH_PROFILE
  unsigned long long* prof = nullptr;  // a profiling build launched without a record buffer
  void* params[] = {(void*)args, (void*)&prof};
#else
  void* params[] = {(void*)args};
#endif
  e = cudaLaunchCooperativeKernel((const void*)latch_kernel, dim3(grid), dim3(LATCH_BLOCK), params, (size_t)smem,
                                  (cudaStream_t)stream);
  return (int)e;
}

#ifdef LATCH_PROFILE
// Profiling builds only (the runtime finds this symbol to know it has one): like latch_launch, with
// ``prof`` pointing at (sm_begin[num_lists] + grid + queued tasks) zeroed 16-byte records (see the top of this file).
int latch_launch_profile(const latch::Args* args, unsigned long long* prof, int device, int grid, long long smem,
                         void* stream) {
  if (grid > LATCH_MAX_BLOCKS) return (int)cudaErrorInvalidConfiguration;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return (int)e;
  void* params[] = {(void*)args, (void*)&prof};
  e = cudaLaunchCooperativeKernel((const void*)latch_kernel, dim3(grid), dim3(LATCH_BLOCK), params, (size_t)smem,
                                  (cudaStream_t)stream);
  return (int)e;
}
#endif

}  // extern "C"

// The emulators' threads (emulator.cpp, emulator_wgmma.cpp): N ucontext fibers on one OS thread,
// run round-robin and switched only where one waits. Included inside namespace emu after
// `constexpr int N` (the number of fibers); run_block(fn, arg) runs fn(arg) on every fiber, with
// threadIdx.x set to the fiber's index, until each has returned.
#pragma once

static ucontext_t sched_ctx, fib_ctx[N];
static bool done[N];
static int cur;

// A barrier of ``size`` fibers: the last to arrive releases the others (a new generation).
struct Barrier { int size, count = 0; long gen = 0; };

void yield_now() { swapcontext(&fib_ctx[cur], &sched_ctx); }
static void wait(Barrier& b) {
  const long gen = b.gen;
  if (++b.count == b.size) {
    b.count = 0;
    ++b.gen;
    return;
  }
  while (b.gen == gen) yield_now();
}

static void (*job)(void*);
static void* job_arg;
static void trampoline(int i) {
  job(job_arg);
  done[i] = true;
}

// Run job(arg) on all N fibers, round-robin until every one returned.
static void run_block(void (*fn)(void*), void* arg) {
  static std::vector<char> stacks((size_t)N * 256 * 1024);
  job = fn;
  job_arg = arg;
  for (int i = 0; i < N; ++i) {
    done[i] = false;
    getcontext(&fib_ctx[i]);
    fib_ctx[i].uc_stack.ss_sp = stacks.data() + (size_t)i * 256 * 1024;
    fib_ctx[i].uc_stack.ss_size = 256 * 1024;
    fib_ctx[i].uc_link = &sched_ctx;
    makecontext(&fib_ctx[i], (void (*)())trampoline, 1, i);
  }
  bool any = true;
  while (any) {
    any = false;
    for (int i = 0; i < N; ++i) {
      if (done[i]) continue;
      any = true;
      cur = i;
      threadIdx.x = (unsigned)i;
      swapcontext(&sched_ctx, &fib_ctx[i]);
    }
  }
}

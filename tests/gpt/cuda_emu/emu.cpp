/* tests/gpt/cuda_emu/emu.cpp — the fibers behind emu_device.h: one fiber
 * per CUDA thread of the running CTA (threads numbered x fastest, as CUDA
 * forms warps; on x86-64 switched by the few lines of assembly below, as
 * ucontext's switches make a system call each; elsewhere ucontext), and a
 * scheduler that runs one warp at a time as far as it can go (its lanes in
 * turn to their next barrier, again while all 32 wait at a warp barrier),
 * warps and lanes highest index first, or lowest first when $EMU_ORDER is
 * "low"; then releases the CTA when every thread waits at __syncthreads.
 * Anything else is a deadlock (a divergent barrier) and aborts. Shuffles
 * and votes exchange through per-thread slots between two warp barriers. */
#include "emu_device.h"

#include <map>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

dim3 threadIdx, blockIdx, blockDim, gridDim;
/* the kernels' extern __shared__ (kernels_emu.cpp names its float array so) */
thread_local __attribute__((aligned(128))) unsigned char smem[EMU_SMEM];

static std::map<const void *, int> smem_limit;
void emu_set_smem_limit(const void *kernel, int bytes) { smem_limit[kernel] = bytes; }
int emu_smem_limit(const void *kernel) {
  auto it = smem_limit.find(kernel);
  return it == smem_limit.end() ? EMU_SMEM_DEFAULT : it->second;
}

enum { RUN, AT_BLOCK, AT_WARP, DONE, MAXT = 1024, STACK = 128 * 1024 };

static int state[MAXT];
static float slots[MAXT];
static char *stacks;
static unsigned cur;
static const std::function<void()> *running;

static void fiber_main(void);

#if defined(__x86_64__)
/* emu_fiber_switch(&save, to): the callee-saved registers onto this stack,
 * its pointer into save, then the same back off stack `to` */
extern "C" void emu_fiber_switch(void **save, void *to);
asm(".text\n.globl emu_fiber_switch\n.type emu_fiber_switch,@function\n"
    "emu_fiber_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n.size emu_fiber_switch, .-emu_fiber_switch\n");
static void *sched_sp, *fiber_sp[MAXT];
/* fiber i's first switch pops six zeros and returns into fiber_main with
 * the stack aligned as after a call */
static void fiber_make(unsigned i) {
  void **sp = (void **)(stacks + (size_t)(i + 1) * STACK - 64);
  for (int r = 0; r < 6; r++)
    sp[r] = NULL;
  sp[6] = (void *)fiber_main, sp[7] = NULL;
  fiber_sp[i] = sp;
}
static void fiber_enter(unsigned i) { emu_fiber_switch(&sched_sp, fiber_sp[i]); }
static void fiber_leave(void) { emu_fiber_switch(&fiber_sp[cur], sched_sp); }
#else
static ucontext_t sched, ctx[MAXT];
static void fiber_make(unsigned i) {
  getcontext(&ctx[i]);
  ctx[i].uc_stack.ss_sp = stacks + (size_t)i * STACK;
  ctx[i].uc_stack.ss_size = STACK;
  ctx[i].uc_link = &sched;
  makecontext(&ctx[i], fiber_main, 0);
}
static void fiber_enter(unsigned i) { swapcontext(&sched, &ctx[i]); }
static void fiber_leave(void) { swapcontext(&ctx[cur], &sched); }
#endif

void emu_check(int ok, const char *what) {
  if (ok) return;
  fprintf(stderr, "cuda emulation: %s (block %u %u %u, thread %u)\n", what, blockIdx.x, blockIdx.y,
          blockIdx.z, threadIdx.x);
  abort();
}

int emu_low_first(void) {
  static const int low = getenv("EMU_ORDER") && !strcmp(getenv("EMU_ORDER"), "low");
  return low;
}

/* fiber i's threadIdx in the running block */
static dim3 thread_of(unsigned i) {
  return dim3(i % blockDim.x, i / blockDim.x % blockDim.y, i / (blockDim.x * blockDim.y));
}

static void yield(int st) {
  state[cur] = st;
  fiber_leave();
}
void __syncthreads(void) { yield(AT_BLOCK); }
void __syncwarp(unsigned mask) {
  emu_check(mask == 0xffffffffu, "__syncwarp: partial mask");
  yield(AT_WARP);
}
float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
  unsigned t = cur;
  slots[t] = v;
  __syncwarp(mask);
  float r = slots[(t & ~31u) | ((t & 31u) ^ (unsigned)lane_mask)];
  __syncwarp(mask);
  return r;
}

int __any_sync(unsigned mask, int pred) {
  unsigned t = cur, any = 0;
  slots[t] = pred ? 1.0f : 0.0f;
  __syncwarp(mask);
  for (unsigned l = 0; l < 32; l++)
    any |= slots[(t & ~31u) | l] != 0.0f;
  __syncwarp(mask);
  return any != 0;
}

static void fiber_main(void) {
  (*running)();
  state[cur] = DONE;
  fiber_leave(); /* never resumed */
  abort();
}

/* Runs warp w's lanes (in the run's order) until none can go on alone:
 * each runnable lane to its next barrier, the warp released again while
 * all 32 wait at a warp barrier. Returns whether any lane ran. */
static int run_warp(unsigned w, int low_first) {
  int ran = 0;
  for (;;) {
    unsigned at_warp = 0;
    for (unsigned k = 0; k < 32; k++) {
      unsigned i = w * 32 + (low_first ? k : 31 - k);
      if (state[i] == RUN) {
        cur = i, threadIdx = thread_of(i), ran = 1;
        fiber_enter(i);
      }
      at_warp += state[i] == AT_WARP;
    }
    if (at_warp < 32) return ran;
    for (unsigned l = 0; l < 32; l++)
      state[w * 32 + l] = RUN;
  }
}

/* Each warp in turn runs as far as it can before the next starts (the
 * most skewed schedule: a warp reaches its next __syncthreads before any
 * other moves), then the CTA barrier releases all. */
void emu_run_block(unsigned n, size_t bytes, const std::function<void()> &body) {
  emu_check(n % 32 == 0 && n <= MAXT, "block size");
  (void)bytes;
  const int low_first = emu_low_first();
  if (!stacks) stacks = (char *)malloc((size_t)MAXT * STACK);
  emu_check(stacks != NULL, "no memory for the fibers' stacks");
  memset(smem, 0xff, sizeof smem);
  running = &body;
  for (unsigned i = 0; i < n; i++)
    fiber_make(i), state[i] = RUN;
  for (;;) {
    int ran = 0;
    for (unsigned k = 0; k < n / 32; k++)
      ran |= run_warp(low_first ? k : n / 32 - 1 - k, low_first);
    unsigned done = 0, at_block = 0;
    for (unsigned i = 0; i < n; i++)
      done += state[i] == DONE, at_block += state[i] == AT_BLOCK;
    if (done == n) return;
    threadIdx = thread_of(0);
    emu_check(at_block == n || ran, "deadlock: threads wait at different barriers");
    if (at_block == n)
      for (unsigned i = 0; i < n; i++)
        state[i] = RUN;
  }
}

// Launches of kernels on CPU threads through the host prelude (prelude.h beside this file): each
// CTA a forked process whose one OS thread runs the block's threads as fibers, device memory in
// shared mappings made before the fork, so that the CTAs of a launch see each other's writes as a
// GPU's would. Fibers rather than an OS thread each: a launch's threads outnumber the cores a
// hundredfold, and the kernel's barriers and shuffles, handed between OS threads, kept the
// machine in the scheduler rather than in the kernels. A stage's test
// driver includes this once (it defines the prelude's emulation state), allocates with
// emu_device_alloc and runs launches with emu_launch.
//
// A launch is watched by its progress rather than by a fixed time: every block, wave or named
// barrier that completes, in any CTA, counts, and so does a CTA that ends. A launch that counts
// nothing while its CTAs spend `stall_seconds` of CPU time (threads spinning in polls that never
// end), or while every thread of them sleeps for `stall_seconds` (threads parked at barriers that
// never fill), is killed.
// A CTA that backs off (its fibers all waited a round without progress, so it sleeps between
// rounds) counts as asleep, whatever state it is in when looked at. Neither counts the time a loaded
// machine leaves the threads waiting to run, so a busy machine slows a launch without failing it.
// The first time a launch stalls so, the waits are told (emu_stalled): a debug build's bounded
// waits give up and report what they waited on, and the CTAs end as they would on a GPU. A launch
// that stalls a second time (waits that cannot give up) is killed.
#pragma once
#include "prelude.h"

#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <sched.h>
#include <unordered_set>
#include <string>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

u32 emu_thread;
u32 emu_block, emu_block_dim, emu_grid_dim;
u64 emu_exchange[64][64];
u32 emu_agree[MONO_BARRIERS];
u64 emu_cta_progress;
// Shared with the launcher: a word a CTA (1 while it backs off), and the stall flag.
u32* emu_backoff;
u32* emu_stalled;
// Shared: the kernel thread id of each CTA's one OS thread, so the launcher knows which backs off.
static pid_t* emu_tids;

// Zeroed memory shared by every CTA process forked after the call.
template <class T>
T* emu_device_alloc(size_t n) {
  void* p = mmap(nullptr, n * sizeof(T) + 64, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  return (T*)p;
}

// Barriers passed in all CTAs of the running launch, block, wave and named (shared; the launcher
// watches it).
static u64* emu_progress;

// A fiber's saved context. On x86-64 a switch pushes the callee-saved registers and the FP
// control words on the old stack and keeps its stack pointer: glibc's swapcontext also saves the
// signal mask, a system call at every switch, and a kernel's shuffles switch fibers twice each.
#if defined(__x86_64__)
struct emu_context {
  void* sp;
};
extern "C" void emu_switch_stack(void** save, void* load);
asm(R"(
  .text
  .globl emu_switch_stack
  .type emu_switch_stack, @function
emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch_stack, .-emu_switch_stack
)");
static void emu_switch(emu_context* from, emu_context* to) { emu_switch_stack(&from->sp, to->sp); }
static void emu_jump(emu_context* to) {
  void* discarded;
  emu_switch_stack(&discarded, to->sp);
}
// A context that starts `entry` on the stack [base, base + bytes): the frame a switch pops (six
// zeroed registers, the default MXCSR and x87 control word), then `entry` as the return address
// and a slot where a call would have left one, so that `entry` begins with its stack aligned as
// the ABI has it after a call.
static void emu_make(emu_context* c, void* base, size_t bytes, void (*entry)()) {
  u64* top = (u64*)(((uintptr_t)base + bytes) & ~(uintptr_t)15);
  *--top = 0;
  *--top = (u64)(uintptr_t)entry;
  for (int r = 0; r < 6; ++r) *--top = 0;
  *--top = 0x1F80ull | (0x037Full << 32);
  c->sp = top;
}
#else
#include <ucontext.h>
struct emu_context {
  ucontext_t uc;
};
static void emu_switch(emu_context* from, emu_context* to) { swapcontext(&from->uc, &to->uc); }
static void emu_jump(emu_context* to) { setcontext(&to->uc); }
static void emu_make(emu_context* c, void* base, size_t bytes, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack = {base, 0, bytes};
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
#endif

// The CTA's fibers, run in turn by its one OS thread.
struct emu_fiber {
  emu_context context;
  bool done;
};
static emu_fiber* emu_fibers;
static emu_context emu_cta_context;
static u32 emu_live;
// Rounds of the fibers with no progress, and the progress count when the round began.
static u32 emu_idle_rounds;
static u64 emu_round_start;
// After EMU_YIELD_ROUNDS idle rounds the CTA sleeps between rounds, twice as long each time up to
// EMU_SLEEP_MAX_NS: its polls wait on other CTAs, and the other CTA processes need the cores.
#define EMU_YIELD_ROUNDS 4u
#define EMU_SLEEP_MAX_NS 200000u

static void emu_round_ended() {
  u32* backoff = emu_backoff + emu_block;
  if (emu_cta_progress != emu_round_start) {
    if (emu_idle_rounds > EMU_YIELD_ROUNDS) __atomic_store_n(backoff, 0u, __ATOMIC_RELAXED);
    emu_idle_rounds = 0;
    emu_round_start = emu_cta_progress;
    return;
  }
  if (emu_idle_rounds < EMU_YIELD_ROUNDS) {
    ++emu_idle_rounds;
    sched_yield();
    return;
  }
  if (emu_idle_rounds == EMU_YIELD_ROUNDS) __atomic_store_n(backoff, 1u, __ATOMIC_RELAXED);
  const u32 doublings = emu_idle_rounds - EMU_YIELD_ROUNDS;
  if (doublings < 8) ++emu_idle_rounds;
  const u64 ns = 1000ull << doublings;
  const timespec t{0, (long)(ns < EMU_SLEEP_MAX_NS ? ns : EMU_SLEEP_MAX_NS)};
  nanosleep(&t, nullptr);
}

// The next live fiber after the running one, ending a round when the turn wraps past the last.
static u32 emu_next_fiber() {
  u32 next = emu_thread;
  do {
    next = next + 1 == emu_block_dim ? 0 : next + 1;
    if (next == 0) emu_round_ended();
  } while (emu_fibers[next].done);
  return next;
}

void emu_yield() {
  const u32 from = emu_thread, to = emu_next_fiber();
  if (to == from) return;
  emu_thread = to;
  emu_switch(&emu_fibers[from].context, &emu_fibers[to].context);
}

// A fiber's body has returned: the next live fiber runs, or the CTA is done.
static void emu_fiber_ended() {
  emu_fibers[emu_thread].done = true;
  if (--emu_live == 0) emu_jump(&emu_cta_context);
  emu_thread = emu_next_fiber();
  emu_jump(&emu_fibers[emu_thread].context);
}

template <class Body>
static Body* emu_body;
template <class Body>
static void emu_fiber_main() {
  (*emu_body<Body>)();
  emu_fiber_ended();
}

// A barrier of `count` threads: the last to arrive passes at once, the others wait their turns
// until it has.
struct emu_barrier {
  u32 count, arrived;
  u64 generation;
};
static emu_barrier emu_block_barrier;
static emu_barrier emu_wave_barrier[64];
static emu_barrier emu_named_barrier[MONO_BARRIERS];

static void emu_barrier_wait(emu_barrier& b) {
  const u64 generation = b.generation;
  if (++b.arrived == b.count) {
    b.arrived = 0;
    ++b.generation;
    emu_busy();
    __atomic_fetch_add(emu_progress, 1, __ATOMIC_RELAXED);
    return;
  }
  while (b.generation == generation) emu_yield();
}

void emu_sync_block() { emu_barrier_wait(emu_block_barrier); }
void emu_sync_wave(u32 wave) { emu_barrier_wait(emu_wave_barrier[wave]); }
// Named barrier `id` of `threads` threads: its count set on first use, as the hardware's take
// theirs from the first arrival.
void emu_sync_named(u32 id, u32 threads) {
  emu_barrier& b = emu_named_barrier[id];
  if (b.count == 0) b.count = threads;
  emu_barrier_wait(b);
}

// Runs the CTA's `block` threads as fibers until every one has returned.
template <class Body>
static void emu_run_cta(u32 block, Body& body) {
  // Kernel frames are small, but a fiber's stack is only touched as it grows.
  const size_t stack_bytes = 1u << 20;
  emu_fibers = new emu_fiber[block]();
  emu_body<Body> = &body;
  for (u32 t = 0; t < block; ++t) {
    void* stack = mmap(nullptr, stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stack == MAP_FAILED) {
      perror("mmap");
      _exit(2);
    }
    emu_make(&emu_fibers[t].context, stack, stack_bytes, emu_fiber_main<Body>);
  }
  emu_live = block;
  emu_thread = 0;
  emu_switch(&emu_cta_context, &emu_fibers[0].context);
}

// CPU time (clock ticks) of every thread of the live CTAs, and whether all of them sleep (or back
// off: `backing_off` holds their thread ids).
struct emu_usage {
  u64 ticks;
  bool asleep;
};
static emu_usage emu_usage_of(const std::vector<pid_t>& ctas, const std::unordered_set<pid_t>& backing_off) {
  emu_usage u{0, true};
  for (pid_t pid : ctas) {
    if (pid == 0) continue;
    const std::string dir = "/proc/" + std::to_string(pid) + "/task";
    DIR* d = opendir(dir.c_str());
    if (!d) continue;
    while (const dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      FILE* f = fopen((dir + "/" + e->d_name + "/stat").c_str(), "r");
      if (!f) continue;
      char line[1024];
      const size_t n = fread(line, 1, sizeof line - 1, f);
      fclose(f);
      line[n] = 0;
      // After the name's ')': state, then fields 4 .. 13, then utime and stime.
      const char* p = strrchr(line, ')');
      if (!p) continue;
      char state;
      unsigned long long utime, stime;
      if (sscanf(p + 2, "%c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu", &state, &utime, &stime) != 3) continue;
      u.ticks += utime + stime;
      if (state != 'S' && state != 'Z' && !backing_off.count((pid_t)atoi(e->d_name))) u.asleep = false;
    }
    closedir(d);
  }
  return u;
}

// Statuses of emu_launch.
#define EMU_OK 0
#define EMU_CTA_FAILED 1  // a CTA trapped, crashed or exited with an error
#define EMU_STALLED 3     // no barrier passed in any CTA while it spun or slept for stall_seconds, twice

// Runs `grid` CTAs of `block` threads, body() on every thread (mono_thread() and mono_block() set),
// every CTA resident at once.
template <class Body>
int emu_launch(u32 grid, u32 block, Body body, u32 stall_seconds = 30) {
  if (block % MONO_WAVE != 0 || block / MONO_WAVE > 64) {
    fprintf(stderr, "emu_launch: a block of %u threads is not 1..64 whole waves of %u\n", block, MONO_WAVE);
    return EMU_CTA_FAILED;
  }
  if (!emu_progress) emu_progress = emu_device_alloc<u64>(1);
  if (!emu_stalled) emu_stalled = emu_device_alloc<u32>(1);
  *emu_stalled = 0;
  emu_backoff = emu_device_alloc<u32>(grid);
  emu_tids = emu_device_alloc<pid_t>(grid);
  const auto backing_off = [&] {
    std::unordered_set<pid_t> tids;
    for (u32 b = 0; b < grid; ++b)
      if (__atomic_load_n(&emu_backoff[b], __ATOMIC_RELAXED)) tids.insert(__atomic_load_n(&emu_tids[b], __ATOMIC_RELAXED));
    return tids;
  };
  const auto release = [&] {
    munmap(emu_backoff, grid * sizeof(u32) + 64);
    munmap(emu_tids, grid * sizeof(pid_t) + 64);
  };
  std::vector<pid_t> ctas;
  for (u32 b = 0; b < grid; ++b) {
    const pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      for (pid_t p : ctas) kill(p, SIGKILL);
      for (pid_t p : ctas) waitpid(p, nullptr, 0);
      release();
      return EMU_CTA_FAILED;
    }
    if (pid == 0) {
      emu_block = b;
      emu_grid_dim = grid;
      emu_block_dim = block;
      emu_block_barrier.count = block;
      for (u32 w = 0; w < block / MONO_WAVE; ++w) emu_wave_barrier[w].count = MONO_WAVE;
      __atomic_store_n(&emu_tids[b], gettid(), __ATOMIC_RELAXED);
      emu_run_cta(block, body);
      _exit(0);
    }
    ctas.push_back(pid);
  }
  int status = EMU_OK;
  const u64 tick = (u64)sysconf(_SC_CLK_TCK);
  u64 seen = __atomic_load_n(emu_progress, __ATOMIC_RELAXED);
  u64 ticks_then = emu_usage_of(ctas, {}).ticks;
  time_t asleep_since = 0;
  size_t running = ctas.size();
  bool finished = false;
  for (u32 polls = 1; running > 0; ++polls) {
    for (pid_t& p : ctas) {
      int st;
      if (p == 0 || waitpid(p, &st, WNOHANG) != p) continue;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) status = EMU_CTA_FAILED;
      p = 0;
      --running;
      finished = true;
    }
    usleep(2000);
    if (running == 0 || polls % 50 != 0) continue;  // the threads' state every 0.1 s
    const emu_usage u = emu_usage_of(ctas, backing_off());
    const u64 now = __atomic_load_n(emu_progress, __ATOMIC_RELAXED);
    // A CTA that ends is progress too (a kernel may pass no barrier at all), and the CPU time
    // of the CTAs still running starts again from what they have spent.
    if (now != seen || finished) {
      finished = false;
      seen = now, ticks_then = u.ticks, asleep_since = 0;
      continue;
    }
    if (!u.asleep)
      asleep_since = 0;
    else if (asleep_since == 0)
      asleep_since = time(nullptr);
    const bool spun = u.ticks - ticks_then > (u64)stall_seconds * tick;
    const bool slept = asleep_since != 0 && time(nullptr) - asleep_since > (time_t)stall_seconds;
    if (!spun && !slept) continue;
    const char* why = spun ? "the CTAs spent CPU time" : "every thread slept or backed off";
    if (!*emu_stalled) {
      fprintf(stderr, "stalled: no barrier passed while %s for %u s; the waits are told\n", why, stall_seconds);
      __atomic_store_n(emu_stalled, 1u, __ATOMIC_RELAXED);
      seen = now, ticks_then = u.ticks, asleep_since = 0;
      continue;
    }
    fprintf(stderr, "hung: no barrier passed while %s for %u s, twice\n", why, stall_seconds);
    for (pid_t p : ctas)
      if (p) kill(p, SIGKILL);
    for (pid_t p : ctas)
      if (p) waitpid(p, nullptr, 0);
    release();
    return EMU_STALLED;
  }
  release();
  return status;
}

// Launches of kernels on CPU threads through the host prelude (prelude.h beside this file): each
// CTA a forked process of the block's std::threads, device memory in shared mappings made before
// the fork, so that the CTAs of a launch see each other's writes as a GPU's would. A stage's test
// driver includes this once (it defines the prelude's emulation state), allocates with
// emu_device_alloc and runs launches with emu_launch.
//
// A launch is watched by its progress rather than by a fixed time: every block or named barrier
// that completes, in any CTA, counts; a launch that counts nothing for `stall_seconds` is killed
// (a wait that never ends stops every barrier), however slowly a loaded machine runs it.
#pragma once
#include "prelude.h"

#include <barrier>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

thread_local u32 emu_thread;
u32 emu_block, emu_block_dim, emu_grid_dim;
u64 emu_exchange[64][64];
u32 emu_agree[MONO_BARRIERS];

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

// Barriers passed in all CTAs of the running launch (shared; the launcher watches it).
static u64* emu_progress;
struct emu_tick {
  void operator()() noexcept { __atomic_fetch_add(emu_progress, 1, __ATOMIC_RELAXED); }
};
static std::barrier<emu_tick>* emu_block_barrier;
static std::barrier<>* emu_wave_barrier[64];
static std::barrier<emu_tick>* emu_named_barrier[MONO_BARRIERS];
static std::mutex emu_named_lock;

void emu_sync_block() { emu_block_barrier->arrive_and_wait(); }
void emu_sync_wave(u32 wave) { emu_wave_barrier[wave]->arrive_and_wait(); }
// Named barrier `id` of `threads` threads: made on first use, as the hardware's take their count
// from the first arrival.
void emu_sync_named(u32 id, u32 threads) {
  std::barrier<emu_tick>* b;
  {
    std::lock_guard<std::mutex> hold(emu_named_lock);
    if (!emu_named_barrier[id]) emu_named_barrier[id] = new std::barrier<emu_tick>(threads);
    b = emu_named_barrier[id];
  }
  b->arrive_and_wait();
}

// Statuses of emu_launch.
#define EMU_OK 0
#define EMU_CTA_FAILED 1  // a CTA trapped, crashed or exited with an error
#define EMU_STALLED 3     // no barrier passed in any CTA for stall_seconds

// Runs `grid` CTAs of `block` threads, body() on every thread (mono_thread() and mono_block() set),
// every CTA resident at once.
template <class Body>
int emu_launch(u32 grid, u32 block, Body body, u32 stall_seconds = 30) {
  if (block % MONO_WAVE != 0 || block / MONO_WAVE > 64) {
    fprintf(stderr, "emu_launch: a block of %u threads is not 1..64 whole waves of %u\n", block, MONO_WAVE);
    return EMU_CTA_FAILED;
  }
  if (!emu_progress) emu_progress = emu_device_alloc<u64>(1);
  std::vector<pid_t> ctas;
  for (u32 b = 0; b < grid; ++b) {
    const pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      for (pid_t p : ctas) kill(p, SIGKILL);
      for (pid_t p : ctas) waitpid(p, nullptr, 0);
      return EMU_CTA_FAILED;
    }
    if (pid == 0) {
      emu_block = b;
      emu_grid_dim = grid;
      emu_block_dim = block;
      emu_block_barrier = new std::barrier<emu_tick>(block);
      for (u32 w = 0; w < block / MONO_WAVE; ++w) emu_wave_barrier[w] = new std::barrier<>(MONO_WAVE);
      std::vector<std::thread> threads;
      for (u32 t = 0; t < block; ++t) threads.emplace_back([t, &body] {
          emu_thread = t;
          body();
        });
      for (auto& t : threads) t.join();
      _exit(0);
    }
    ctas.push_back(pid);
  }
  int status = EMU_OK;
  u64 seen = __atomic_load_n(emu_progress, __ATOMIC_RELAXED);
  time_t last = time(nullptr);
  size_t running = ctas.size();
  while (running > 0) {
    for (pid_t& p : ctas) {
      int st;
      if (p == 0 || waitpid(p, &st, WNOHANG) != p) continue;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) status = EMU_CTA_FAILED;
      p = 0;
      --running;
      last = time(nullptr);
    }
    const u64 now = __atomic_load_n(emu_progress, __ATOMIC_RELAXED);
    if (now != seen) {
      seen = now;
      last = time(nullptr);
    } else if (running > 0 && time(nullptr) - last > (time_t)stall_seconds) {
      for (pid_t p : ctas)
        if (p) kill(p, SIGKILL);
      for (pid_t p : ctas)
        if (p) waitpid(p, nullptr, 0);
      return EMU_STALLED;
    }
    usleep(1000);
  }
  return status;
}

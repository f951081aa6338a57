// Launches of kernels on CPU threads through the host prelude (prelude.h beside this file): each
// CTA a forked process of the block's std::threads, device memory in shared mappings made before
// the fork, so that the CTAs of a launch see each other's writes as a GPU's would. A stage's test
// driver includes this once (it defines the prelude's emulation state), allocates with
// emu_device_alloc and runs launches with emu_launch.
//
// A launch is watched by its progress rather than by a fixed time: every block, wave or named
// barrier that completes, in any CTA, counts, and so does a CTA that ends. A launch that counts
// nothing while its CTAs spend `stall_seconds` of CPU time (threads spinning in polls that never
// end), or while every thread of them sleeps for `stall_seconds` (threads parked at barriers that
// never fill), is killed.
// A thread that polls in the prelude's back-off (sleeping between polls of a box that stays empty)
// counts as asleep, whatever state it is in when looked at. Neither counts the time a loaded
// machine leaves the threads waiting to run, so a busy machine slows a launch without failing it.
// The first time a launch stalls so, the waits are told (emu_stalled): a debug build's bounded
// waits give up and report what they waited on, and the CTAs end as they would on a GPU. A launch
// that stalls a second time (waits that cannot give up) is killed.
#pragma once
#include "prelude.h"

#include <barrier>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <unordered_set>
#include <mutex>
#include <string>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

thread_local u32 emu_thread;
u32 emu_block, emu_block_dim, emu_grid_dim;
u64 emu_exchange[64][64];
u32 emu_agree[MONO_BARRIERS];
thread_local u32 emu_idle_loads;
// Shared with the launcher: a word a thread of the launch (1 while it backs off), and the stall flag.
u32* emu_backoff;
u32* emu_stalled;
// Shared: the kernel thread id of each thread of the launch, so the launcher knows which backs off.
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
struct emu_tick {
  void operator()() noexcept { __atomic_fetch_add(emu_progress, 1, __ATOMIC_RELAXED); }
};
static std::barrier<emu_tick>* emu_block_barrier;
static std::barrier<emu_tick>* emu_wave_barrier[64];
static std::barrier<emu_tick>* emu_named_barrier[MONO_BARRIERS];
static std::mutex emu_named_lock;

void emu_sync_block() {
  emu_busy();
  emu_block_barrier->arrive_and_wait();
}
void emu_sync_wave(u32 wave) {
  emu_busy();
  emu_wave_barrier[wave]->arrive_and_wait();
}
// Named barrier `id` of `threads` threads: made on first use, as the hardware's take their count
// from the first arrival.
void emu_sync_named(u32 id, u32 threads) {
  emu_busy();
  std::barrier<emu_tick>* b;
  {
    std::lock_guard<std::mutex> hold(emu_named_lock);
    if (!emu_named_barrier[id]) emu_named_barrier[id] = new std::barrier<emu_tick>(threads);
    b = emu_named_barrier[id];
  }
  b->arrive_and_wait();
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
  const size_t n_threads = (size_t)grid * block;
  emu_backoff = emu_device_alloc<u32>(n_threads);
  emu_tids = emu_device_alloc<pid_t>(n_threads);
  const auto backing_off = [&] {
    std::unordered_set<pid_t> tids;
    for (size_t i = 0; i < n_threads; ++i)
      if (__atomic_load_n(&emu_backoff[i], __ATOMIC_RELAXED)) tids.insert(__atomic_load_n(&emu_tids[i], __ATOMIC_RELAXED));
    return tids;
  };
  const auto release = [&] {
    munmap(emu_backoff, n_threads * sizeof(u32) + 64);
    munmap(emu_tids, n_threads * sizeof(pid_t) + 64);
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
      emu_block_barrier = new std::barrier<emu_tick>(block);
      for (u32 w = 0; w < block / MONO_WAVE; ++w) emu_wave_barrier[w] = new std::barrier<emu_tick>(MONO_WAVE);
      std::vector<std::thread> threads;
      for (u32 t = 0; t < block; ++t) threads.emplace_back([t, b, block, &body] {
          emu_thread = t;
          __atomic_store_n(&emu_tids[(size_t)b * block + t], gettid(), __ATOMIC_RELAXED);
          body();
        });
      for (auto& t : threads) t.join();
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

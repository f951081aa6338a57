// Runs one launch of the select stage from its own source on CPU threads (tests/host_emulation.rs):
// the standalone entry's task-list loop over the table the test built, every CTA a forked process
// of MONO_CTA_THREADS threads, device memory in shared mappings. Besides select's kinds it runs a
// producer (stage MBX_STAGE_SYNTHETIC, own kind 1) that stands in for the indexer's scoring: after
// a delay it copies the fresh scores of row args[0] over the stale ones, publishes them and puts its
// one output box, which the row's select tasks wait on.
//   driver <input> <output>
// input (little-endian u32 words): rows, stride, pages_stride (0: no page table), n_ctas, n_tasks,
// scratch_boxes, hist_offset, cand_offset, cand_stride, fresh (1: fresh scores follow the stale
// ones), delay_ms (the producer's); then offsets [n_ctas + 1], tasks [n_tasks][16], lens, scores
// [rows, stride], the fresh scores when given, the page table [rows, pages_stride]. output: flags
// [rows, SEL_FLAGS], then the lists [rows, SEL_K]. Exit status 3: the launch hung (no thread passed
// a barrier of its block, wave or team while the CTAs ran or all slept: see STALL_*), 1: a CTA that
// did not exit cleanly (a trap, a crash).
#include <csignal>
#include <cstdio>
#include <ctime>
#include <dirent.h>
#include <mutex>
#include <string>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "select.hip"

#define PRODUCER_KIND ((MBX_STAGE_SYNTHETIC << MBX_STAGE_SHIFT) | 1u)
// A launch is hung when no thread passes a barrier while its CTAs spend STALL_CPU_SECONDS of CPU
// time (threads spinning in polls that never end), or while every thread of them sleeps for
// STALL_SLEEP_SECONDS (threads parked at barriers that never fill). Neither counts the time a
// loaded machine leaves them waiting to run, so a busy machine slows a launch without failing it.
#define STALL_CPU_SECONDS 10
#define STALL_SLEEP_SECONDS 5

thread_local u32 emu_thread;
u32 emu_block, emu_block_dim = MONO_CTA_THREADS, emu_grid_dim;
u64 emu_exchange[64][64];
static u64* progress;  // shared by every CTA: barriers passed (block, wave and named)
static std::barrier<>* block_barrier;
static std::barrier<>* wave_barrier[64];
void emu_sync_block() {
  block_barrier->arrive_and_wait();
  if (emu_thread == 0) __atomic_fetch_add(progress, 1, __ATOMIC_RELAXED);
}
void emu_sync_wave(u32 wave) {
  wave_barrier[wave]->arrive_and_wait();
  if (emu_thread % MONO_WAVE == 0) __atomic_fetch_add(progress, 1, __ATOMIC_RELAXED);
}
u32 emu_agree[MONO_BARRIERS];
static std::barrier<>* named_barrier[MONO_BARRIERS];
static std::mutex named_lock;
void emu_sync_named(u32 id, u32 threads) {
  std::barrier<>* b;
  {
    std::lock_guard<std::mutex> hold(named_lock);
    if (!named_barrier[id]) named_barrier[id] = new std::barrier<>(threads);
    b = named_barrier[id];
  }
  b->arrive_and_wait();
  if (emu_thread % threads == 0) __atomic_fetch_add(progress, 1, __ATOMIC_RELAXED);
}

template <class T>
static T* device_alloc(size_t n) {
  void* p = mmap(nullptr, n * sizeof(T) + 64, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  return (T*)p;
}

static void read_words(FILE* f, void* dst, size_t n) {
  if (fread(dst, 4, n, f) != n) {
    fprintf(stderr, "short input\n");
    exit(2);
  }
}

// CPU time (clock ticks) of every thread of the live CTAs, and whether all of them sleep.
struct Usage {
  u64 ticks;
  bool asleep;
};
static Usage usage(const std::vector<pid_t>& ctas) {
  Usage u{0, true};
  for (pid_t pid : ctas) {
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
      if (state != 'S' && state != 'Z') u.asleep = false;
    }
    closedir(d);
  }
  return u;
}

// Forks a CTA per list, waits for them all; 3 when the launch hung (STALL_*).
template <class Body>
static int launch(u32 grid, Body body) {
  std::vector<pid_t> ctas;
  for (u32 b = 0; b < grid; ++b) {
    const pid_t pid = fork();
    if (pid == 0) {
      emu_block = b;
      emu_grid_dim = grid;
      block_barrier = new std::barrier<>(MONO_CTA_THREADS);
      for (u32 w = 0; w < MONO_CTA_THREADS / MONO_WAVE; ++w) wave_barrier[w] = new std::barrier<>(MONO_WAVE);
      std::vector<std::thread> threads;
      for (u32 t = 0; t < MONO_CTA_THREADS; ++t) threads.emplace_back([t, &body] {
          emu_thread = t;
          body();
        });
      for (auto& t : threads) t.join();
      _exit(0);
    }
    ctas.push_back(pid);
  }
  const u64 tick = (u64)sysconf(_SC_CLK_TCK);
  u64 seen = __atomic_load_n(progress, __ATOMIC_RELAXED);
  u64 ticks_then = usage(ctas).ticks;
  time_t asleep_since = 0;
  int status = 0;
  u32 polls = 0;
  while (!ctas.empty()) {
    for (size_t i = 0; i < ctas.size();) {
      int st;
      if (waitpid(ctas[i], &st, WNOHANG) != ctas[i]) {
        ++i;
        continue;
      }
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) status = 1;
      ctas.erase(ctas.begin() + i);
    }
    usleep(2000);
    if (++polls % 50 != 0) continue;  // the threads' state every 0.1 s
    const Usage u = usage(ctas);
    const u64 now = __atomic_load_n(progress, __ATOMIC_RELAXED);
    if (now != seen) {
      seen = now, ticks_then = u.ticks, asleep_since = 0;
      continue;
    }
    if (!u.asleep)
      asleep_since = 0;
    else if (asleep_since == 0)
      asleep_since = time(nullptr);
    const bool spun = u.ticks - ticks_then > STALL_CPU_SECONDS * tick;
    const bool slept = asleep_since != 0 && time(nullptr) - asleep_since > STALL_SLEEP_SECONDS;
    if (spun || slept) {
      if (spun)
        fprintf(stderr, "hung: no barrier passed while the CTAs spent %d s of CPU time\n", STALL_CPU_SECONDS);
      else
        fprintf(stderr, "hung: no barrier passed while every thread slept for %d s\n", STALL_SLEEP_SECONDS);
      for (pid_t p : ctas) kill(p, SIGKILL);
      for (pid_t p : ctas) waitpid(p, nullptr, 0);
      return 3;
    }
  }
  return status;
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  u32 h[11];
  read_words(f, h, 11);
  const u32 rows = h[0], stride = h[1], pages_stride = h[2], n_ctas = h[3], n_tasks = h[4], scratch_boxes = h[5];
  const u32 fresh = h[9], delay_ms = h[10];
  u32* offsets = device_alloc<u32>(n_ctas + 1);
  read_words(f, offsets, n_ctas + 1);
  mbx_task* tasks = device_alloc<mbx_task>(n_tasks);
  read_words(f, tasks, (size_t)n_tasks * 16);
  u32* lens = device_alloc<u32>(rows);
  read_words(f, lens, rows);
  float* scores = device_alloc<float>((size_t)rows * stride);
  read_words(f, scores, (size_t)rows * stride);
  float* fresh_scores = nullptr;
  if (fresh) {
    fresh_scores = device_alloc<float>((size_t)rows * stride);
    read_words(f, fresh_scores, (size_t)rows * stride);
  }
  i32* pages = nullptr;
  if (pages_stride) {
    pages = device_alloc<i32>((size_t)rows * pages_stride);
    read_words(f, pages, (size_t)rows * pages_stride);
  }
  fclose(f);
  i32* out = device_alloc<i32>((size_t)rows * SEL_K);
  for (size_t i = 0; i < (size_t)rows * SEL_K; ++i) out[i] = (i32)0x80000000;  // never a task's entry
  u32* flags = device_alloc<u32>(rows * SEL_FLAGS);
  u64* scratch = device_alloc<u64>(scratch_boxes);
  u32* epoch = device_alloc<u32>(1);
  u32* diag = device_alloc<u32>(8);
  progress = device_alloc<u64>(1);
  const mbx_launch l{tasks, offsets, scratch, epoch, diag, nullptr, n_ctas, 1, 0, 0};
  const sel_args a{scores, pages, out, flags, nullptr, stride, pages_stride, h[6], h[7], h[8], 0};
  const int status = launch(n_ctas, [&] {
    const auto team = mono_cta_team<MONO_CTA_THREADS>();
    mbx_run_launch(l, [&](mbx_ctx& c, const mbx_task& t) {
      if (t.kind != PRODUCER_KIND) return sel_decode(team, t, c, a, sel_lds);
      const u64 row = t.args[0];
      if (mono_thread() == 0) usleep(delay_ms * 1000);
      mono_sync_block();
      for (u32 i = mono_thread(); i < stride; i += MONO_CTA_THREADS) scores[row * stride + i] = fresh_scores[row * stride + i];
      mono_sync_block();
      if (mono_thread() == 0) {
        mbx_publish();
        mbx_put(c, t.out.first, 1);
      }
      return true;
    });
  });
  if (diag[0]) fprintf(stderr, "stall: task %u box %u cta %u\n", diag[1], diag[2], diag[3]);
  FILE* o = fopen(argv[2], "wb");
  fwrite(flags, 4, rows * SEL_FLAGS, o);
  fwrite(out, 4, (size_t)rows * SEL_K, o);
  fclose(o);
  return status;
}

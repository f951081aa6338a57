// Runs one launch of linear_tasks from its own source on CPU threads (tests/host_emulation.rs):
// every CTA a forked process of MONO_CTA_THREADS threads, device memory in shared mappings.
//   driver <input> <output>
// input (little-endian u32 words): ctas, tasks, matrices, scratch boxes, arena bytes; the tasks
// (16 words each), the offsets (ctas + 1), the matrices (20 words each, their pointers given as
// byte offsets into the arena, all ones for none), then the arena (weights, scales, x, y, ...).
// output: the arena after the launch. Exit status 3: the launch did not end within two minutes.
#include <csignal>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "linear.hip"

thread_local u32 emu_thread;
u32 emu_block, emu_block_dim = MONO_CTA_THREADS, emu_grid_dim;
u64 emu_exchange[64][64];
static std::barrier<>* block_barrier;
static std::barrier<>* wave_barrier[64];
void emu_sync_block() { block_barrier->arrive_and_wait(); }
void emu_sync_wave(u32 wave) { wave_barrier[wave]->arrive_and_wait(); }
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
}

static void* device_alloc(size_t bytes) {
  void* p = mmap(nullptr, bytes + 64, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  return p;
}

static void read_bytes(FILE* f, void* dst, size_t n) {
  if (fread(dst, 1, n, f) != n) {
    fprintf(stderr, "short input\n");
    exit(2);
  }
}

template <class Body>
static int launch(u32 grid, u32 block, Body body) {
  std::vector<pid_t> ctas;
  for (u32 b = 0; b < grid; ++b) {
    const pid_t pid = fork();
    if (pid == 0) {
      emu_block = b;
      emu_grid_dim = grid;
      emu_block_dim = block;
      block_barrier = new std::barrier<>(block);
      for (u32 w = 0; w < block / MONO_WAVE; ++w) wave_barrier[w] = new std::barrier<>(MONO_WAVE);
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
  const time_t start = time(nullptr);
  int status = 0;
  for (size_t i = 0; i < ctas.size();) {
    int st;
    if (waitpid(ctas[i], &st, WNOHANG) == ctas[i]) {
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) status = 1;
      ++i;
    } else if (time(nullptr) - start > 120) {
      for (pid_t p : ctas) kill(p, SIGKILL);
      return 3;
    } else {
      usleep(1000);
    }
  }
  return status;
}

template <class T>
static T* relocate(u8* arena, const T* offset) {
  const u64 off = (u64)offset;
  return off == ~0ull ? nullptr : (T*)(arena + off);
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  u32 h[5];
  read_bytes(f, h, sizeof h);
  const u32 ctas = h[0], n_tasks = h[1], n_mats = h[2], scratch_boxes = h[3], arena_bytes = h[4];
  static_assert(sizeof(lin_matrix) == 80, "lin_matrix must match the Rust LinMatrix");
  auto* tasks = (mbx_task*)device_alloc(sizeof(mbx_task) * (n_tasks + 1));
  read_bytes(f, tasks, sizeof(mbx_task) * n_tasks);
  auto* offsets = (u32*)device_alloc(4 * (ctas + 1));
  read_bytes(f, offsets, 4 * (ctas + 1));
  auto* mats = (lin_matrix*)device_alloc(sizeof(lin_matrix) * n_mats);
  read_bytes(f, mats, sizeof(lin_matrix) * n_mats);
  auto* arena = (u8*)device_alloc(arena_bytes);
  read_bytes(f, arena, arena_bytes);
  fclose(f);
  for (u32 i = 0; i < n_mats; ++i) {
    lin_matrix& m = mats[i];
    m.w = relocate(arena, m.w);
    m.scales = relocate(arena, m.scales);
    m.x = relocate(arena, m.x);
    m.y = relocate(arena, (u8*)m.y);
    m.residual = relocate(arena, m.residual);
    m.row_scale = relocate(arena, m.row_scale);
  }
  auto* scratch = (u64*)device_alloc(8 * scratch_boxes);
  auto* epoch = (u32*)device_alloc(4);
  auto* diag = (u32*)device_alloc(4 * MBX_DIAG_WORDS);
  const mbx_launch l = {tasks, offsets, scratch, epoch, diag, ctas, 1, 0, 0};
  const lin_args a = {mats, n_mats, 0};
  const int status = launch(ctas, MONO_CTA_THREADS, [&] { linear_tasks(l, a); });
  if (diag[0]) fprintf(stderr, "stall: task %u box %u cta %u\n", diag[1], diag[2], diag[3]);
  FILE* o = fopen(argv[2], "wb");
  fwrite(arena, 1, arena_bytes, o);
  fclose(o);
  return status != 0 ? status : diag[0] ? 4 : 0;
}

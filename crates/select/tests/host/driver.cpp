// Runs one launch of a select kernel from its own source on CPU threads (tests/host_emulation.rs):
// every CTA a forked process with the kernel's threads (SEL_BLOCK, or SEL_REG_BLOCK for the
// registers kernel), device memory in shared mappings.
//   driver <input> <output>
// input (little-endian u32 words): method (0 one-CTA, 1 multi-slice, 2 registers), rows, stride, pages_stride
// (0: no page table), runs, tasks, hist_offset, cand_offset, cand_stride, scratch_boxes; then lens,
// scores [rows, stride], the page table [rows, pages_stride]. output: flags [rows, SEL_FLAGS], then
// the lists [rows, SEL_K]. Exit status 3: the launch did not end within a minute.
#include <csignal>
#include <mutex>
#include <cstdio>
#include <ctime>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "select.hip"

thread_local u32 emu_thread;
u32 emu_block, emu_block_dim = SEL_BLOCK, emu_grid_dim;
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
    } else if (time(nullptr) - start > 60) {
      for (pid_t p : ctas) kill(p, SIGKILL);
      return 3;
    } else {
      usleep(1000);
    }
  }
  return status;
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  u32 h[10];
  read_words(f, h, 10);
  const u32 method = h[0], rows = h[1], stride = h[2], pages_stride = h[3], runs = h[4], tasks = h[5];
  const u32 hist_offset = h[6], cand_offset = h[7], cand_stride = h[8], scratch_boxes = h[9];
  u32* lens = device_alloc<u32>(rows);
  read_words(f, lens, rows);
  float* scores = device_alloc<float>((size_t)rows * stride);
  read_words(f, scores, (size_t)rows * stride);
  i32* pages = nullptr;
  if (pages_stride) {
    pages = device_alloc<i32>((size_t)rows * pages_stride);
    read_words(f, pages, (size_t)rows * pages_stride);
  }
  fclose(f);
  i32* out = device_alloc<i32>((size_t)rows * SEL_K);
  for (size_t i = 0; i < (size_t)rows * SEL_K; ++i) out[i] = (i32)0x80000000;  // never a kernel's entry
  u32* flags = device_alloc<u32>(rows * SEL_FLAGS);
  u64* scratch = device_alloc<u64>(scratch_boxes);
  u32* epoch = device_alloc<u32>(1);
  u32* diag = device_alloc<u32>(8);
  int status = 2;
  if (method == 0)
    status = launch(rows, SEL_BLOCK,
                    [&] { select_one_cta(scores, stride, lens, rows, pages, pages_stride, out, flags, nullptr); });
  if (method == 1)
    status = launch(tasks, SEL_BLOCK, [&] {
      select_multi_slice(scores, stride, lens, rows, runs, pages, pages_stride, out, flags, scratch, epoch, 1, 0,
                         hist_offset, cand_offset, cand_stride, diag, nullptr);
    });
  if (method == 2)
    status = launch(rows, SEL_REG_BLOCK, [&] {
      select_in_registers(scores, stride, lens, rows, pages, pages_stride, out, flags, nullptr);
    });
  if (diag[0]) fprintf(stderr, "stall: task %u box %u cta %u\n", diag[1], diag[2], diag[3]);
  FILE* o = fopen(argv[2], "wb");
  fwrite(flags, 4, rows * SEL_FLAGS, o);
  fwrite(out, 4, (size_t)rows * SEL_K, o);
  fclose(o);
  return status;
}

// How long a block of code takes to run the first time, out of the SM's instruction cache, while
// other SMs stream HBM as a fused launch's weight links do; and how much code the cache keeps.
//
//     nvcc -O3 -gencode=arch=compute_90a,code=sm_90a tools/probes/icache.cu -o /tmp/icache && /tmp/icache
//
// CTA 0 (512 threads, one an SM as the fused launches run) waits 20 us for the stream to build,
// then runs a straight-line block of N KB of code (N KB / 16 fma instructions, one dependent chain
// a thread) three times: first, again at once, and again after another 128 KB block has run. The
// other CTAs read their slices of an 8 GB buffer (four 16-byte loads in flight a thread) or do
// nothing; in the last case CTA 0's own warps 8..15 stream too, as a linear task's groups do while
// its leader waits. Each line is the median of five launches of the same kernel (its code stays in
// the caches between launches, so "first" is cold only where another block evicted it); times are
// read from %globaltimer, so a few tens of ns is the resolution.
//
// With MONO_BENCH_JSON set it also appends each line's figure there as a record (the format of
// `device::report`; MONO_BENCH_COMMIT and MONO_BENCH_COMMAND name the run), which
// `tools/bench/benchmarks.py --take` puts in BENCHMARKS.md's instruction-cache table.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#define F1 asm volatile("fma.rn.f32 %0, %0, %1, %0;" : "+f"(a) : "f"(b));
#define F4 F1 F1 F1 F1
#define F16 F4 F4 F4 F4
#define F64 F16 F16 F16 F16
#define F256 F64 F64 F64 F64  // 4 KB of code

template <int KB>
__device__ __noinline__ float block(float a, float b);
template <>
__device__ __noinline__ float block<4>(float a, float b) { F256 return a; }
template <>
__device__ __noinline__ float block<16>(float a, float b) { F256 F256 F256 F256 return a; }
template <>
__device__ __noinline__ float block<64>(float a, float b) {
  F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 return a;
}
// The evicting block: 128 KB of other code.
__device__ __noinline__ float evict(float a, float b) {
  F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256
  F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 F256 return a * b;
}

__device__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ void stream(const uint4* buf, size_t begin, size_t end, unsigned tid, unsigned threads, float* out) {
  uint4 acc = {0, 0, 0, 0};
  for (size_t i = begin + tid; i + 3 * threads < end; i += 4 * threads) {
    const uint4 v0 = buf[i], v1 = buf[i + threads], v2 = buf[i + 2 * threads], v3 = buf[i + 3 * threads];
    acc.x ^= v0.x ^ v1.x ^ v2.x ^ v3.x;
  }
  if (acc.x == 0x12345u) out[4095] = 1.f;  // keeps the loads
}

enum Load { IDLE = 0, OTHERS = 1, OTHERS_AND_OWN = 2 };

template <int KB>
__global__ void __launch_bounds__(512, 1) probe(const uint4* buf, size_t n, int load, float* out,
                                                unsigned long long* t) {
  const size_t per = n / gridDim.x;
  if (blockIdx.x > 0) {
    if (load != IDLE) stream(buf, blockIdx.x * per, (blockIdx.x + 1) * per, threadIdx.x, 512, out);
    return;
  }
  if (load == OTHERS_AND_OWN && threadIdx.x >= 256) {
    stream(buf, 0, per, threadIdx.x - 256, 256, out);
    return;
  }
  const unsigned long long t0 = now();
  while (now() - t0 < 20000) {
  }
  float a = threadIdx.x, b = 1.0001f;
  const unsigned long long s0 = now();
  a = block<KB>(a, b);
  const unsigned long long s1 = now();
  a = block<KB>(a, b);
  const unsigned long long s2 = now();
  a = evict(a, b);
  const unsigned long long s3 = now();
  a = block<KB>(a, b);
  const unsigned long long s4 = now();
  if (threadIdx.x == 0) t[0] = s1 - s0, t[1] = s2 - s1, t[2] = s4 - s3;
  out[threadIdx.x] = a;
}

// One record of the figure (us) beside its baseline, the same block run at once from the cache.
void record(const char* device, int kb, const char* load, double figure, double baseline) {
  const char* path = getenv("MONO_BENCH_JSON");
  if (!path) return;
  FILE* f = fopen(path, "a");
  if (!f) return;
  const char* commit = getenv("MONO_BENCH_COMMIT");
  const char* command = getenv("MONO_BENCH_COMMAND");
  char date[16];
  const time_t now = time(nullptr);
  strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
  fprintf(f,
          "{\"table\": \"instruction cache\", \"case\": \"%d KB of code, while %s\", \"what\": \"run after 128 KB "
          "of other code\", \"figure\": %.3f, \"unit\": \"us\", \"floor\": null, \"floor_how\": null, "
          "\"baseline\": %.3f, \"baseline_name\": \"run again at once (in the cache)\", \"ratio\": %.3f, "
          "\"ratio_of\": \"baseline\", \"command\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\", "
          "\"device\": \"%s\", \"note\": null}\n",
          kb, load, figure, baseline, figure / baseline, command ? command : "tools/probes/icache.cu",
          commit ? commit : "unknown", date, device);
  fclose(f);
}

template <int KB>
void run(const char* device, const uint4* buf, size_t n, int sms, float* out, unsigned long long* t, int load) {
  std::vector<unsigned long long> first, again, evicted;
  for (int rep = 0; rep < 6; ++rep) {
    probe<KB><<<sms, 512>>>(buf, n, load, out, t);
    unsigned long long h[3];
    cudaMemcpy(h, t, sizeof h, cudaMemcpyDeviceToHost);
    if (rep == 0) continue;  // the first launch also fetches the code from HBM
    first.push_back(h[0]), again.push_back(h[1]), evicted.push_back(h[2]);
  }
  auto median = [](std::vector<unsigned long long> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2] / 1e3;
  };
  const char* what[] = {"nothing else runs", "the other SMs stream", "they and its own SM stream"};
  printf("| %3d | %s | %.2f | %.2f | %.2f |\n", KB, what[load], median(first), median(again), median(evicted));
  record(device, KB, what[load], median(evicted), median(again));
}

int main() {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const int sms = prop.multiProcessorCount;
  const size_t bytes = (size_t)8 << 30;
  uint4* buf = nullptr;
  float* out = nullptr;
  unsigned long long* t = nullptr;
  if (cudaMalloc(&buf, bytes) || cudaMalloc(&out, 4096 * sizeof(float)) || cudaMalloc(&t, 3 * sizeof *t)) {
    fprintf(stderr, "cudaMalloc failed\n");
    return 1;
  }
  cudaMemset(buf, 1, bytes);
  printf("%d SMs; us for CTA 0 to run the block\n\n", sms);
  printf("| KB of code | while | first | again | after 128 KB of other code |\n|---|---|---|---|---|\n");
  for (int load = IDLE; load <= OTHERS_AND_OWN; ++load) {
    run<4>(prop.name, buf, bytes / 16, sms, out, t, load);
    run<16>(prop.name, buf, bytes / 16, sms, out, t, load);
    run<64>(prop.name, buf, bytes / 16, sms, out, t, load);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    fprintf(stderr, "%s\n", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

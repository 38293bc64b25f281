// A notebook's kernel as the reclaimer meets it: it holds a CUDA context and memory on
// one GPU (selected by CUDA_VISIBLE_DEVICES), sits idle, then runs a busy kernel, then
// sits idle again, and exits.
// Usage: holder HOLD_MIB IDLE_S BUSY_S. Prints one JSON line as each phase begins:
// {"phase": "holding" | "busy" | "idle_again" | "exiting", ...}, flushed, so the
// driver (check.py) samples each phase while it lasts.
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

__global__ void spin(unsigned long long cycles, int *out) {
  unsigned long long start = clock64();
  while (clock64() - start < cycles) {
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

static double now_s() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

static void phase(const char *name, const char *extra) {
  printf("{\"phase\": \"%s\", \"at\": %.3f%s}\n", name, now_s(), extra);
  fflush(stdout);
}

static int fail(const char *what, cudaError_t err) {
  printf("{\"phase\": \"error\", \"what\": \"%s\", \"error\": \"%s\"}\n", what,
         cudaGetErrorString(err));
  fflush(stdout);
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: holder HOLD_MIB IDLE_S BUSY_S\n");
    return 2;
  }
  size_t hold = static_cast<size_t>(atol(argv[1])) << 20;
  double idle_s = atof(argv[2]), busy_s = atof(argv[3]);
  void *block = nullptr;
  int *out = nullptr;
  cudaError_t err = cudaMalloc(&block, hold);
  if (err != cudaSuccess) return fail("cudaMalloc", err);
  // Touch the memory so it is really resident, then wait for it: idle from here on.
  if ((err = cudaMemset(block, 1, hold)) != cudaSuccess) return fail("cudaMemset", err);
  if ((err = cudaMalloc(&out, 1024 * sizeof(int))) != cudaSuccess) return fail("cudaMalloc", err);
  if ((err = cudaDeviceSynchronize()) != cudaSuccess) return fail("sync", err);
  char extra[64];
  snprintf(extra, sizeof extra, ", \"held_mib\": %zu", hold >> 20);
  phase("holding", extra);
  std::this_thread::sleep_for(std::chrono::duration<double>(idle_s));

  int khz = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  // Kernels of about 0.1 s each, back to back, for BUSY_S: the GPU is never idle.
  unsigned long long cycles = static_cast<unsigned long long>(khz) * 100ULL;
  phase("busy", "");
  double until = now_s() + busy_s;
  int launched = 0;
  while (now_s() < until) {
    spin<<<4, 256>>>(cycles, out);
    if ((err = cudaDeviceSynchronize()) != cudaSuccess) return fail("spin", err);
    ++launched;
  }
  snprintf(extra, sizeof extra, ", \"kernels\": %d", launched);
  phase("idle_again", extra);
  std::this_thread::sleep_for(std::chrono::duration<double>(idle_s));
  phase("exiting", "");
  cudaFree(out);
  cudaFree(block);
  return 0;
}

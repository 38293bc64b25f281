// One holder of a GPU share, as a notebook would be: it selects its GPU by the UUID in
// CUDA_VISIBLE_DEVICES, caps its allocation at COMPOSE_GPU_MEMORY_FRACTION of the GPU's
// memory (advisory: nothing stops it taking more), and keeps the GPU busy for a while.
// Prints one JSON line: the GPU it saw, what it allocated, when its work ran.
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>

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

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    printf("{\"error\": \"no GPU visible\"}\n");
    return 1;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  char uuid[64];
  const unsigned char *u = reinterpret_cast<const unsigned char *>(prop.uuid.bytes);
  snprintf(uuid, sizeof uuid,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
           u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  const char *fraction_env = getenv("COMPOSE_GPU_MEMORY_FRACTION");
  double fraction = fraction_env ? atof(fraction_env) : 1.0;
  // Half of its share: the rest is left for the framework's own overheads.
  size_t want = static_cast<size_t>(total * fraction * 0.5);
  void *block = nullptr;
  cudaError_t allocated = cudaMalloc(&block, want);
  int *out = nullptr;
  cudaMalloc(&out, 1024 * sizeof(int));
  int khz = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  double began = now_s();
  spin<<<4, 256>>>(static_cast<unsigned long long>(khz) * 1000ULL * 3, out);
  cudaError_t ran = cudaDeviceSynchronize();
  double ended = now_s();
  printf("{\"devices\": %d, \"name\": \"%s\", \"uuid\": \"%s\", \"total_mib\": %zu, "
         "\"allocated_mib\": %zu, \"alloc_ok\": %s, \"run_ok\": %s, \"began\": %.3f, "
         "\"ended\": %.3f}\n",
         count, prop.name, uuid, total >> 20, allocated == cudaSuccess ? want >> 20 : 0,
         allocated == cudaSuccess ? "true" : "false", ran == cudaSuccess ? "true" : "false", began,
         ended);
  return ran == cudaSuccess && allocated == cudaSuccess ? 0 : 1;
}

// bench/fusion_cuda.cu — the fusion claim on the CUDA backend: a chain of k cheap elementwise
// ops over N floats (default 2^28) runs as ONE kernel at close to the device's copy bandwidth,
// against force_eager (one kernel per op). Copy bandwidth: cudaMemcpy device-to-device of the
// same N floats, measured in the same run. One JSON line per k, same keys as bench/fusion.
//
//   build/bench/fusion_cuda [--n 268435456] [--reps 21]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kiln/cuda.cuh"

#include "chains.hpp"
#include "timing.hpp"

namespace {

using Vec = kiln::Tensor<float, kiln::cuda, kiln::dyn>;

using kiln_bench::chain;

using kiln_bench::median;

// Seconds of one call of f on the executor's stream, by CUDA events.
template <class F>
double time_once(kiln::CudaExecutor& exec, F&& f) {
  cudaEvent_t a, b;
  KILN_CUDA_CHECK(cudaEventCreate(&a));
  KILN_CUDA_CHECK(cudaEventCreate(&b));
  KILN_CUDA_CHECK(cudaEventRecord(a, exec.stream()));
  f();
  KILN_CUDA_CHECK(cudaEventRecord(b, exec.stream()));
  KILN_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  KILN_CUDA_CHECK(cudaEventDestroy(a));
  KILN_CUDA_CHECK(cudaEventDestroy(b));
  return ms * 1e-3;
}

template <int K>
void run(kiln::CudaExecutor& exec, const Vec& x, Vec& y, double copy_s, kiln::index_t n, int reps) {
  std::vector<double> tf, te;
  kiln::assign(y, chain<K>(x), exec);
  kiln::assign<kiln::stance::force_eager>(y, chain<K>(x), exec);
  for (int r = 0; r < reps; ++r) {
    tf.push_back(time_once(exec, [&] { kiln::assign(y, chain<K>(x), exec); }));
    te.push_back(time_once(exec, [&] { kiln::assign<kiln::stance::force_eager>(y, chain<K>(x), exec); }));
  }
  const double f = median(tf), e = median(te), bytes = 8.0 * double(n);
  std::printf(
      "{\"bench\": \"fusion\", \"backend\": \"cuda\", \"device\": \"%s\", \"k\": %d, \"n\": %lld, \"fused_s\": %.6g, "
      "\"eager_s\": %.6g, \"fused_over_eager\": %.4f, \"fused_gbps\": %.2f, \"copy_gbps\": %.2f, \"frac_of_copy\": %.4f}\n",
      kiln::cu::device_name().c_str(), K, (long long)n, f, e, e / f, bytes / f * 1e-9, bytes / copy_s * 1e-9,
      copy_s / f);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  kiln::index_t n = kiln::index_t(1) << 28;
  int reps = 21;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--n") n = std::atoll(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
  }
  if (!kiln::cu::device_available()) {
    std::printf("{\"bench\": \"fusion\", \"backend\": \"cuda\", \"skipped\": \"%s\"}\n",
                kiln::cu::device_unavailable_reason().c_str());
    return 0;
  }
  kiln::CudaExecutor exec;
  Vec x(n), y(n);
  kiln::assign(x, 0.5f, exec);
  std::vector<double> tc;
  for (int r = 0; r < reps; ++r)
    tc.push_back(time_once(exec, [&] {
      KILN_CUDA_CHECK(cudaMemcpyAsync(y.data(), x.data(), std::size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                      exec.stream()));
    }));
  const double copy_s = median(tc);
  run<1>(exec, x, y, copy_s, n, reps);
  run<2>(exec, x, y, copy_s, n, reps);
  run<3>(exec, x, y, copy_s, n, reps);
  run<4>(exec, x, y, copy_s, n, reps);
  run<5>(exec, x, y, copy_s, n, reps);
  run<6>(exec, x, y, copy_s, n, reps);
  run<7>(exec, x, y, copy_s, n, reps);
  run<8>(exec, x, y, copy_s, n, reps);
  return 0;
}

// bench/fusion_cuda.cu — the fusion claim on the CUDA backend: a chain of k cheap elementwise
// ops over N floats (default 2^28) runs as ONE kernel at close to the device's copy bandwidth,
// against force_eager (one kernel per op).
//
// Timing (bench/cuda_timing.cuh): device time by CUDA events on the executor's stream, the
// stream held until a block of calls is queued; after warm-up calls, the median of --reps blocks.
// Bytes: the fused kernel must read x and write y, 8·N bytes ("bytes"); the copy reference is
// cudaMemcpyAsync device-to-device of N floats (reads and writes the same 8·N bytes), measured in
// the same run on the same stream.
//
// One JSON line per k: bench ("fusion"), backend ("cuda"), device, k, n, bytes, fused_s, eager_s,
// fused_over_eager, fused_gbps, eager_gbps (the same 8·N bytes over the eager time), copy_s,
// copy_gbps, fraction_of_copy (copy_s / fused_s), eager_fraction_of_copy, calls (per timed
// block), reps, host_gaps (true if a block's queuing outlasted the stream hold: that block's time
// includes host gaps). Without a device: a skip line, exit 0 (2 with KILN_REQUIRE_DEVICE set).
//
//   build/bench/fusion_cuda [--n 268435456] [--reps 21]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln/cuda.cuh"

#include "chains.hpp"
#include "cuda_timing.cuh"

namespace {

using Vec = kiln::Tensor<float, kiln::cuda, kiln::dyn>;

using kiln_bench::chain;

template <int K>
void run(kiln::CudaExecutor& exec, kiln_bench::GpuTimer& timer, const Vec& x, Vec& y, double copy_s,
         kiln::index_t n, int reps) {
  auto fused = [&](int) { kiln::assign(y, chain<K>(x), exec); };
  auto eager = [&](int) { kiln::assign<kiln::stance::force_eager>(y, chain<K>(x), exec); };
  timer.reset_host_gaps();
  const int calls = timer.calls_for(2e-3, 20, [](int) {}, fused);
  const double f = timer.per_call(1, reps, calls, fused);
  const double e = timer.per_call(1, reps, calls, eager);
  const double bytes = 8.0 * double(n);
  std::printf(
      "{\"bench\": \"fusion\", \"backend\": \"cuda\", \"device\": \"%s\", \"k\": %d, \"n\": %lld, \"bytes\": %.0f, "
      "\"fused_s\": %.6g, \"eager_s\": %.6g, \"fused_over_eager\": %.4f, \"fused_gbps\": %.2f, \"eager_gbps\": %.2f, "
      "\"copy_s\": %.6g, \"copy_gbps\": %.2f, \"fraction_of_copy\": %.4f, \"eager_fraction_of_copy\": %.4f, "
      "\"calls\": %d, \"reps\": %d, \"host_gaps\": %s}\n",
      kiln::cu::device_name().c_str(), K, (long long)n, bytes, f, e, e / f, bytes / f * 1e-9, bytes / e * 1e-9, copy_s,
      bytes / copy_s * 1e-9, copy_s / f, copy_s / e, calls, reps, timer.host_gaps() ? "true" : "false");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  kiln::index_t n = kiln::index_t(1) << 28;
  int reps = 21;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--n") n = std::atoll(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
  }
  if (n < 1 || reps < 1) {
    std::fprintf(stderr, "fusion_cuda: --n and --reps must be positive\n");
    return 2;
  }
  if (!kiln::cu::device_available()) return kiln::cu::report_no_device("fusion_cuda");
  kiln::CudaExecutor exec;
  kiln_bench::GpuTimer timer(exec.stream());
  Vec x(n), y(n);
  kiln::assign(x, 0.5f, exec);
  double copy_s = 0;
  {
    kiln_bench::CopyReference copy(timer, reps);
    copy_s = copy.seconds(std::size_t(n) * 2 * sizeof(float));
  }
  run<1>(exec, timer, x, y, copy_s, n, reps);
  run<2>(exec, timer, x, y, copy_s, n, reps);
  run<3>(exec, timer, x, y, copy_s, n, reps);
  run<4>(exec, timer, x, y, copy_s, n, reps);
  run<5>(exec, timer, x, y, copy_s, n, reps);
  run<6>(exec, timer, x, y, copy_s, n, reps);
  run<7>(exec, timer, x, y, copy_s, n, reps);
  run<8>(exec, timer, x, y, copy_s, n, reps);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fusion_cuda: FAILED: %s\n", e.what());
  return 1;
}

// bench/train_step_cuda.cu — bench/train_step on the CUDA backend: one training step (forward,
// cross-entropy, backward, AdamW) of the MLP 400-256-128-10 (ReLU) at batch 64, 256 and 1024,
// with the model as Sequential<...>::on<kiln::cuda>, kiln::CudaExecutor and the multi-tensor
// kiln::optim::AdamW<kiln::cuda> (deduced from the model); side by side with PyTorch eager on the same device
// (bench/torch_train_step.py --device cuda) when torch with CUDA imports.
//
// Timing: after --warmup steps, --reps blocks of --steps steps, each block timed by CUDA events
// recorded on the executor's stream around it; ms per step is the median block over --steps.
// Nothing in the loop waits for the device except what kiln does itself (the loss stays on the
// device). Inputs and labels are random and stay on the device; GEMMs are fp32 (no TF32), as
// PyTorch's default.
//
// One JSON line per batch: bench, backend ("cuda"), device, batch, steps, reps, kiln_ms,
// torch_ms, speedup (torch_ms / kiln_ms; both null without torch's CUDA), kernels_per_step (the
// executor's LaunchStats over the timed steps), kernels_by_kind, loss (after the last step, a
// sanity check). Without a CUDA device it says so on stderr and exits 0.
//
//   build/bench/train_step_cuda [--steps 100] [--reps 11] [--warmup 50] [--python /usr/bin/python3]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "kiln/cuda.cuh"
#include "kiln/nn/cuda.cuh"
#include "kiln/optim/cuda_step.cuh"

#include "mlp_step.hpp"

namespace {

using Model = kiln_bench::Mlp::on<kiln::cuda>;

struct KilnStep {
  double ms;
  double kernels;
  std::map<std::string, double> by_kind;
  float loss;
};

KilnStep kiln_step(kiln::index_t batch, int warmup, int steps, int reps) {
  kiln::CudaExecutor exec;
  kiln::ag::Tape<kiln::CudaExecutor> tape(exec);
  Model model(0);
  kiln::optim::AdamW opt(model, {.lr = 1e-3});  // AdamW<kiln::cuda>: the model's space
  kiln::Generator gen(1);
  kiln::Tensor<float, kiln::host, kiln::dyn, 400> hx(batch, 400);
  for (kiln::index_t i = 0; i < hx.size(); ++i) hx.data()[i] = gen.uniform();
  kiln::Tensor<std::int32_t, kiln::host, kiln::dyn> hy(batch);
  for (kiln::index_t i = 0; i < batch; ++i) hy.data()[i] = std::int32_t(gen.below(10));
  kiln::ag::Var<float, kiln::cuda, kiln::dyn, 400> x(kiln::to_device(hx));
  const kiln::Tensor<std::int32_t, kiln::cuda, kiln::dyn> y = kiln::to_device(hy);

  // The loss of the latest step, kept so that it can be read once at the end.
  kiln::ag::Var<float, kiln::cuda> loss;
  auto step = [&] {
    auto logits = model.forward(tape, x);
    loss = kiln::nn::cross_entropy(tape, logits, y);
    model.zero_grad();
    tape.backward(loss);
    opt.step(exec);
  };

  for (int i = 0; i < warmup; ++i) step();
  exec.synchronize();
  exec.stats().reset();

  cudaEvent_t start, stop;
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> per_step;
  for (int r = 0; r < reps; ++r) {
    KILN_CUDA_CHECK(cudaEventRecord(start, exec.stream()));
    for (int i = 0; i < steps; ++i) step();
    KILN_CUDA_CHECK(cudaEventRecord(stop, exec.stream()));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    per_step.push_back(double(ms) / steps);
  }
  KILN_CUDA_CHECK(cudaEventDestroy(start));
  KILN_CUDA_CHECK(cudaEventDestroy(stop));

  KilnStep out;
  out.ms = kiln_bench::median(per_step);
  const double measured = double(steps) * reps;
  out.kernels = double(exec.stats().launches()) / measured;
  for (const auto& [k, n] : exec.stats().by_kind()) out.by_kind[k] = double(n) / measured;
  out.loss = 0;
  KILN_CUDA_CHECK(cudaMemcpyAsync(&out.loss, loss.value().data(), sizeof(float), cudaMemcpyDeviceToHost,
                                  exec.stream()));
  exec.synchronize();
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  int steps = 100, reps = 11, warmup = 50;
  std::string python = "/usr/bin/python3";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--warmup") warmup = std::atoi(argv[i + 1]);
    else if (a == "--python") python = argv[i + 1];
  }
  if (steps < 1 || reps < 1 || warmup < 0) {
    std::fprintf(stderr, "train_step_cuda: --steps and --reps must be positive, --warmup not negative\n");
    return 2;
  }
  if (!kiln::cu::device_available()) {
    std::fprintf(stderr, "train_step_cuda: skipped, no CUDA device (%s)\n",
                 kiln::cu::device_unavailable_reason().c_str());
    return 0;
  }
  // PyTorch first, so that the two never share the device at the same time.
  const auto torch = kiln_bench::torch_train_steps(
      python, "--device cuda --warmup " + std::to_string(warmup) + " --steps " + std::to_string(steps) +
                  " --reps " + std::to_string(reps));
  for (long batch : {64L, 256L, 1024L}) {
    const KilnStep k = kiln_step(batch, warmup, steps, reps);
    const auto it = torch.find(batch);
    std::printf("{\"bench\": \"train_step\", \"backend\": \"cuda\", \"device\": \"%s\", \"batch\": %ld, "
                "\"steps\": %d, \"reps\": %d, \"kiln_ms\": %.4f, ",
                kiln::cu::device_name().c_str(), batch, steps, reps, k.ms);
    if (it != torch.end())
      std::printf("\"torch_ms\": %.4f, \"speedup\": %.3f, ", it->second, it->second / k.ms);
    else
      std::printf("\"torch_ms\": null, \"speedup\": null, ");
    std::printf("\"kernels_per_step\": %.1f, \"kernels_by_kind\": {", k.kernels);
    const char* sep = "";
    for (const auto& [kind, n] : k.by_kind) {
      std::printf("%s\"%s\": %.1f", sep, kind.c_str(), n);
      sep = ", ";
    }
    if (std::isfinite(k.loss)) std::printf("}, \"loss\": %.6g}\n", double(k.loss));
    else std::printf("}, \"loss\": null}\n");  // JSON has no NaN
    std::fflush(stdout);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_step_cuda: %s\n", e.what());
  return 1;
}

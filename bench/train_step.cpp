// bench/train_step — one training step (forward, cross-entropy, backward, AdamW) of an MLP
// 400-256-128-10 on the CPU backend at batch 64, 256 and 1024, side by side with the same step
// in PyTorch eager (bench/torch_train_step.py, run in the same process tree when torch imports).
//
// One JSON line per batch: bench, backend, batch, threads, kiln_ms, torch_ms, speedup,
// kernels_per_step. Medians over many steps after a warm-up.
//
//   build/bench/train_step [--threads 1] [--steps 300] [--gemm own|cblas] [--python /usr/bin/python3]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "kiln.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/optim/adam.hpp"

#include "mlp_step.hpp"

namespace {

using Model = kiln_bench::Mlp;
using kiln_bench::median;

struct KilnStep {
  double ms;
  double kernels;
};

KilnStep kiln_step(kiln::index_t batch, int threads, int steps) {
  kiln::CpuExecutor exec(threads);
  kiln::ag::Tape<kiln::CpuExecutor> tape(exec);
  Model model(0);
  kiln::optim::AdamW opt(model, {.lr = 1e-3});
  kiln::Generator gen(1);
  kiln::ag::Var<float, kiln::host, kiln::dyn, 400> x(kiln::Tensor<float, kiln::host, kiln::dyn, 400>(batch, 400));
  for (kiln::index_t i = 0; i < x.value().size(); ++i) x.value().data()[i] = gen.uniform();
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
  for (auto& v : y) v = std::int32_t(gen.below(10));
  std::vector<double> times;
  const int warmup = 30;
  for (int i = 0; i < warmup + steps; ++i) {
    if (i == warmup) exec.stats().reset();
    const auto t0 = std::chrono::steady_clock::now();
    auto logits = model.forward(tape, x);
    auto loss = kiln::nn::cross_entropy(tape, logits, y.data());
    model.zero_grad();
    tape.backward(loss);
    opt.step(exec);
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= warmup) times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return {median(times), double(exec.stats().launches()) / steps};
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, steps = 300;
  std::string python = "/usr/bin/python3";
  std::string gemm = kiln::cpu::current_gemm_backend() == kiln::cpu::gemm_backend::cblas ? "cblas" : "own";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--python") python = argv[i + 1];
    else if (a == "--gemm") gemm = argv[i + 1];
  }
  kiln::cpu::set_gemm_backend(gemm == "own" ? kiln::cpu::gemm_backend::own : kiln::cpu::gemm_backend::cblas);
  const auto torch = kiln_bench::torch_train_steps(
      python, "--threads " + std::to_string(threads) + " --steps " + std::to_string(steps));
  for (long batch : {64L, 256L, 1024L}) {
    const KilnStep k = kiln_step(batch, threads, steps);
    const auto it = torch.find(batch);
    std::printf("{\"bench\": \"train_step\", \"backend\": \"cpu\", \"gemm\": \"%s\", \"batch\": %ld, \"threads\": %d, "
                "\"kiln_ms\": %.4f, ",
                gemm.c_str(), batch, threads, k.ms);
    if (it != torch.end())
      std::printf("\"torch_ms\": %.4f, \"speedup\": %.3f, ", it->second, it->second / k.ms);
    else
      std::printf("\"torch_ms\": null, \"speedup\": null, ");
    std::printf("\"kernels_per_step\": %.1f}\n", k.kernels);
  }
  return 0;
}

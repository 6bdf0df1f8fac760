// bench/train_step — one training step (forward, cross-entropy, backward, AdamW) of an MLP
// 400-256-128-10 on the CPU backend at batch 64, 256 and 1024, side by side with its peers, run
// in the same process tree BEFORE kiln's runs (so they never share the cores) with the same
// --threads and --steps: bench/torch_train_step.py (PyTorch eager with the default AdamW, eager
// with AdamW(fused=True), torch.compile) and bench/jax_train_step.py (one jax.jit of the step).
//
// Output, JSON lines: first the peers' own lines as they come (versions, BLAS, thread limits, or
// a "skipped" reason); then per batch
//   kiln:    bench, backend ("cpu"), gemm, batch, threads, kiln_ms, torch_ms and speedup (against
//            PyTorch eager, as before; null without it), kernels_per_step;
//   per peer: bench, batch, threads, kiln_ms, peer (e.g. "torch_compiled", "jax_jit"), peer_ms,
//            speedup (peer_ms / kiln_ms);
//   summary: bench, batch, threads, kiln_ms, fastest_peer, fastest_peer_ms, kiln_faster (null
//            without any peer).
// Medians over many steps after a warm-up.
//
//   build/bench/train_step [--threads 1] [--steps 300] [--gemm own|cblas] [--python PY|none]
// --python defaults to .venv-bench/bin/python in the source tree (scripts/bench.sh --with-peers
// makes it) when it exists, else /usr/bin/python3; "none" runs no peer.
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

// One peer's median ms per step at one batch, from its JSON line.
struct PeerTime {
  std::string peer;
  long batch;
  double ms;
};

int main(int argc, char** argv) {
  int threads = 1, steps = 300;
  std::string python = kiln_bench::default_python();
  std::string gemm = kiln::cpu::current_gemm_backend() == kiln::cpu::gemm_backend::cblas ? "cblas" : "own";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--python") python = argv[i + 1];
    else if (a == "--gemm") gemm = argv[i + 1];
  }
  kiln::cpu::set_gemm_backend(gemm == "own" ? kiln::cpu::gemm_backend::own : kiln::cpu::gemm_backend::cblas);
  std::vector<PeerTime> peers;
  if (python != "none") {
    const std::string args = "--threads " + std::to_string(threads) + " --steps " + std::to_string(steps);
    for (const char* script : {"torch_train_step.py", "jax_train_step.py"}) {
      const auto lines = kiln_bench::peer_lines(python, script, args);
      if (lines.empty())
        std::printf("{\"bench\": \"train_step\", \"peer\": \"%s\", \"skipped\": \"%s printed nothing\"}\n", script,
                    python.c_str());
      for (const auto& l : lines) {
        std::printf("%s\n", l.c_str());
        const std::string peer = kiln_bench::json_field(l, "peer"), batch = kiln_bench::json_field(l, "batch");
        std::string ms = kiln_bench::json_field(l, "torch_ms");
        if (ms.empty()) ms = kiln_bench::json_field(l, "jax_ms");
        if (!peer.empty() && !batch.empty() && !ms.empty() && ms != "null")
          peers.push_back({peer, std::atol(batch.c_str()), std::atof(ms.c_str())});
      }
    }
    std::fflush(stdout);
  }
  for (long batch : {64L, 256L, 1024L}) {
    const KilnStep k = kiln_step(batch, threads, steps);
    const PeerTime* eager = nullptr;
    const PeerTime* fastest = nullptr;
    for (const auto& p : peers) {
      if (p.batch != batch) continue;
      if (p.peer == "torch_eager") eager = &p;
      if (!fastest || p.ms < fastest->ms) fastest = &p;
    }
    std::printf("{\"bench\": \"train_step\", \"backend\": \"cpu\", \"gemm\": \"%s\", \"batch\": %ld, \"threads\": %d, "
                "\"kiln_ms\": %.4f, ",
                gemm.c_str(), batch, threads, k.ms);
    if (eager)
      std::printf("\"torch_ms\": %.4f, \"speedup\": %.3f, ", eager->ms, eager->ms / k.ms);
    else
      std::printf("\"torch_ms\": null, \"speedup\": null, ");
    std::printf("\"kernels_per_step\": %.1f}\n", k.kernels);
    for (const auto& p : peers)
      if (p.batch == batch)
        std::printf("{\"bench\": \"train_step\", \"batch\": %ld, \"threads\": %d, \"kiln_ms\": %.4f, \"peer\": \"%s\", "
                    "\"peer_ms\": %.4f, \"speedup\": %.3f}\n",
                    batch, threads, k.ms, p.peer.c_str(), p.ms, p.ms / k.ms);
    if (fastest)
      std::printf("{\"bench\": \"train_step\", \"batch\": %ld, \"threads\": %d, \"kiln_ms\": %.4f, \"fastest_peer\": "
                  "\"%s\", \"fastest_peer_ms\": %.4f, \"kiln_faster\": %s}\n",
                  batch, threads, k.ms, fastest->peer.c_str(), fastest->ms, k.ms < fastest->ms ? "true" : "false");
    else
      std::printf("{\"bench\": \"train_step\", \"batch\": %ld, \"threads\": %d, \"kiln_ms\": %.4f, \"fastest_peer\": "
                  "null, \"fastest_peer_ms\": null, \"kiln_faster\": null}\n",
                  batch, threads, k.ms);
    std::fflush(stdout);
  }
  return 0;
}

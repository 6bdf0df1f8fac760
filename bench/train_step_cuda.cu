// bench/train_step_cuda.cu — bench/train_step on the CUDA backend: one training step (forward,
// cross-entropy, backward, AdamW) of the MLP 400-256-128-10 (ReLU) at batch 64, 256 and 1024,
// with the model as Sequential<...>::on<kiln::cuda>, kiln::CudaExecutor and the multi-tensor
// kiln::optim::AdamW<kiln::cuda> (deduced from the model); side by side with PyTorch eager on the
// same device, and with the step's parts measured against references taken in the same run:
// each GEMM the step runs against a plain cuBLASLt GEMM of the same shape, the optimizer kernel
// against a device-to-device copy of the bytes it moves.
//
// PyTorch peer: bench/torch_train_step.py --device cuda (same --warmup, --steps, --reps), run by
// --python (default `python3` from PATH; `none` skips it) through popen BEFORE kiln's runs, so the
// two never share the device. Its JSON lines (torch version, device, or why it skipped) are
// copied to stdout as they are; its stderr goes to ours.
//
// Step timing: after --warmup steps, --reps blocks of --steps steps, each block timed by CUDA
// events recorded on the executor's stream around it; ms per step is the median block over
// --steps. Nothing in the loop waits for the device except what kiln does itself (the loss stays
// on the device), so host overhead counts, as it does for PyTorch. Inputs and labels are random
// and stay on the device; GEMMs are fp32 (no TF32), as PyTorch's default.
//
// GEMM and optimizer timing (bench/cuda_timing.cuh): device time only (the stream is held until a
// block of calls is queued), median of --reps blocks. The GEMMs are the eight the step runs
// (checked against the executor's launch records of one step: "gemm_list_matches_step"):
//   fc1/fc2 forward  gemm+bias+relu   Y = relu(X·Wᵀ + b), saving the ReLU mask (RELU_AUX_BIAS)
//   fc3 forward      gemm+bias        logits = Y2·W3ᵀ + b3
//   fc3 dW           gemm+bgrada      dW3 = dLᵀ·Y2 and db3 = column sums of dL
//   fc3 dX           gemm+drelu+bgrad dZ2 = (dL·W3)·[Y2 > 0] and db2 (fc2's ReLU and bias folded in)
//   fc2 dW           gemm             dW2 = dZ2ᵀ·Y1
//   fc2 dX           gemm+drelu+bgrad dZ1 = (dZ2·W2)·[Y1 > 0] and db1
//   fc1 dW           gemm             dW1 = dZ1ᵀ·X
// each called through CudaExecutor::gemm with the step's epilogue (kiln's path: cuBLASLt's
// epilogue, or its fallback when cuBLASLt has none), with use_lt_epilogues(false) (the fallback:
// plain GEMM + kiln's kernel), and as the reference: kiln::cu::Lt::matmul with no epilogue, the
// same m, n, k, transposes, leading dimensions and types. TFLOP/s = 2·m·n·k / seconds.
//
// Output, one JSON line each:
//   per batch: bench ("train_step"), backend ("cuda"), device, batch, steps, reps, kiln_ms,
//     torch_ms, speedup (torch_ms / kiln_ms; both null without the peer), kernels_per_step (the
//     executor's LaunchStats over the timed steps), kernels_by_kind, gemm_ms (the eight GEMMs'
//     device times as measured alone, summed), gemm_list_matches_step, loss (after the last step);
//   per batch and GEMM: bench ("train_step_gemm"), backend, device, batch, gemm (e.g. "fc1_forward"),
//     kind, m, n, k, trans_a, trans_b, dtype ("f32"), tf32 (false), seconds, tflops, plain_seconds,
//     plain_tflops, fraction_of_plain_gemm (plain_seconds / seconds), lt_epilogue (whether
//     cuBLASLt has a kernel for this epilogue and shape: true, false, or null for a plain GEMM),
//     fallback_seconds, fallback_fraction_of_plain_gemm, calls, reps, host_gaps;
//   once: bench ("train_step_optimizer"), backend, device, op ("adamw"), params, tensors, seconds,
//     read_bytes, written_bytes, bytes (AdamW reads value, gradient and both moments and writes
//     value and moments: 28 bytes per fp32 parameter), gbps, copy_s, copy_gbps, fraction_of_copy,
//     launches, calls, reps, host_gaps.
// Without a CUDA device: a skip line, exit 0 (2 with KILN_REQUIRE_DEVICE set). With
// KILN_REQUIRE_DEVICE set, a peer that was asked for and gave no times makes the exit status 2
// (after kiln's lines are printed).
//
//   build/bench/train_step_cuda [--steps 100] [--reps 11] [--warmup 50] [--python python3|none]
#include <stdio.h>  // popen, pclose (POSIX)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/cuda.cuh"
#include "kiln/nn/cuda.cuh"
#include "kiln/optim/cuda_step.cuh"

#include "cuda_timing.cuh"
#include "mlp_step.hpp"

namespace {

using Model = kiln_bench::Mlp::on<kiln::cuda>;
using kiln::index_t;

// ---- the PyTorch peer -------------------------------------------------------------------------

// Runs `python bench/torch_train_step.py <args>`, copies its stdout lines to ours and returns
// batch -> torch_ms from them (empty when it cannot run or skips).
std::map<long, double> torch_peer(const std::string& python, const std::string& args) {
  std::map<long, double> out;
  const std::string cmd = python + " " + std::string(KILN_SOURCE_DIR) + "/bench/torch_train_step.py " + args;
  std::fflush(stdout);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    std::fprintf(stderr, "train_step_cuda: could not start the PyTorch peer: %s\n", cmd.c_str());
    return out;
  }
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    std::fputs(line, stdout);
    long batch = 0;
    double ms = 0;
    const char* b = std::strstr(line, "\"batch\":");
    const char* t = std::strstr(line, "\"torch_ms\":");
    if (b && t && std::sscanf(b, "\"batch\": %ld", &batch) == 1 && std::sscanf(t, "\"torch_ms\": %lf", &ms) == 1)
      out[batch] = ms;
  }
  std::fflush(stdout);
  const int status = pclose(p);
  if (status != 0) std::fprintf(stderr, "train_step_cuda: the PyTorch peer (%s) ended with status %d\n", cmd.c_str(), status);
  return out;
}

// ---- the step ---------------------------------------------------------------------------------

struct KilnStep {
  double ms;
  double kernels;
  std::map<std::string, double> by_kind;
  float loss;
  std::vector<std::pair<std::string, index_t>> gemms;  // (launch name, m·n) of one step's GEMMs, sorted
};

// Random inputs, labels, model and optimizer for one batch size, on one executor.
struct Setup {
  kiln::CudaExecutor exec;
  kiln::ag::Tape<kiln::CudaExecutor> tape{exec};
  Model model{0};
  kiln::optim::AdamW<kiln::cuda> opt{model, {.lr = 1e-3}};
  kiln::ag::Var<float, kiln::cuda, kiln::dyn, 400> x;
  kiln::Tensor<std::int32_t, kiln::cuda, kiln::dyn> y;
  kiln::ag::Var<float, kiln::cuda> loss;  // the latest step's, read once at the end

  explicit Setup(index_t batch) {
    kiln::Generator gen(1);
    kiln::Tensor<float, kiln::host, kiln::dyn, 400> hx(batch, 400);
    for (index_t i = 0; i < hx.size(); ++i) hx.data()[i] = gen.uniform();
    kiln::Tensor<std::int32_t, kiln::host, kiln::dyn> hy(batch);
    for (index_t i = 0; i < batch; ++i) hy.data()[i] = std::int32_t(gen.below(10));
    x = kiln::ag::Var<float, kiln::cuda, kiln::dyn, 400>(kiln::to_device(hx, exec));
    y = kiln::to_device(hy, exec);
  }
  void step() {
    auto logits = model.forward(tape, x);
    loss = kiln::nn::cross_entropy(tape, logits, y);
    model.zero_grad();
    tape.backward(loss);
    opt.step(exec);
  }
};

KilnStep kiln_step(index_t batch, int warmup, int steps, int reps) {
  Setup s(batch);
  kiln::CudaExecutor& exec = s.exec;
  for (int i = 0; i < warmup; ++i) s.step();
  exec.synchronize();

  // One step with launch records on: the GEMMs it runs (names and sizes).
  KilnStep out;
  exec.stats().reset();
  exec.stats().set_recording(true);
  s.step();
  exec.stats().set_recording(false);
  for (const auto& r : exec.stats().records())
    if (r.kind == kiln::kind::gemm) out.gemms.emplace_back(r.name, r.elements);
  std::sort(out.gemms.begin(), out.gemms.end());
  exec.synchronize();
  exec.stats().reset();

  cudaEvent_t start, stop;
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> per_step;
  for (int r = 0; r < reps; ++r) {
    KILN_CUDA_CHECK(cudaEventRecord(start, exec.stream()));
    for (int i = 0; i < steps; ++i) s.step();
    KILN_CUDA_CHECK(cudaEventRecord(stop, exec.stream()));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    per_step.push_back(double(ms) / steps);
  }
  KILN_CUDA_CHECK(cudaEventDestroy(start));
  KILN_CUDA_CHECK(cudaEventDestroy(stop));

  out.ms = kiln_bench::median(per_step);
  const double measured = double(steps) * reps;
  out.kernels = double(exec.stats().launches()) / measured;
  for (const auto& [k, n] : exec.stats().by_kind()) out.by_kind[k] = double(n) / measured;
  out.loss = 0;
  KILN_CUDA_CHECK(cudaMemcpyAsync(&out.loss, s.loss.value().data(), sizeof(float), cudaMemcpyDeviceToHost,
                                  exec.stream()));
  exec.synchronize();
  return out;
}

// ---- the step's GEMMs against plain cuBLASLt GEMMs --------------------------------------------

struct DeviceBuf {
  kiln::Tensor<float, kiln::cuda, kiln::dyn> t;
  explicit DeviceBuf(index_t n, float v, kiln::CudaExecutor& exec) : t(std::max<index_t>(n, 1)) {
    kiln::assign(t, v, exec);
  }
  float* get() { return t.data(); }
};

enum class Epi { bias_relu, bias, bgrada, drelu_bgrad, none };

struct Gemm {
  const char* name;
  const char* kind;  // the executor's launch name
  Epi epi;
  bool ta, tb;
  index_t m, n, k;
  const float* a;
  index_t lda;
  const float* b;
  index_t ldb;
  float* c;
  index_t ldc;
  float* bias = nullptr;      // read (bias epilogues) or written (bias gradients)
  void* aux = nullptr;        // the ReLU mask (written forward, read backward)
  const float* out = nullptr;  // drelu: the forward's output (the fallback reads its sign)
};

struct GemmResult {
  const Gemm* g;
  double seconds, plain_seconds, fallback_seconds;
  int lt_epilogue;  // 1, 0, or -1 (plain GEMM, or the probe failed otherwise)
  int calls;
  bool host_gaps;
};

void run_gemm(kiln::CudaExecutor& exec, const Gemm& g) {
  switch (g.epi) {
    case Epi::bias_relu:
      exec.gemm(g.ta, g.tb, g.m, g.n, g.k, 1.f, g.a, g.lda, g.b, g.ldb, 0.f, g.c, g.ldc,
                kiln::BiasAct<kiln::fn::Relu, float>{g.bias, g.aux});
      break;
    case Epi::bias:
      exec.gemm(g.ta, g.tb, g.m, g.n, g.k, 1.f, g.a, g.lda, g.b, g.ldb, 0.f, g.c, g.ldc,
                kiln::BiasAct<kiln::fn::Identity, float>{g.bias, nullptr});
      break;
    case Epi::bgrada:
      exec.gemm(g.ta, g.tb, g.m, g.n, g.k, 1.f, g.a, g.lda, g.b, g.ldb, 0.f, g.c, g.ldc,
                kiln::BGradA<float>{g.bias, false});
      break;
    case Epi::drelu_bgrad:
      exec.gemm(g.ta, g.tb, g.m, g.n, g.k, 1.f, g.a, g.lda, g.b, g.ldb, 0.f, g.c, g.ldc,
                kiln::DAct<kiln::fn::Relu, float>{g.aux, g.out, g.bias, false});
      break;
    case Epi::none:
      exec.gemm(g.ta, g.tb, g.m, g.n, g.k, 1.f, g.a, g.lda, g.b, g.ldb, 0.f, g.c, g.ldc);
      break;
  }
}

// The same GEMM as cuBLASLt sees it from the executor, with the epilogue (or none).
kiln::cu::MatmulArgs lt_args(const Gemm& g, bool with_epilogue) {
  kiln::cu::MatmulArgs x;
  x.m = g.m;
  x.n = g.n;
  x.k = g.k;
  x.trans_a = g.ta;
  x.trans_b = g.tb;
  x.in_type = x.out_type = kiln::cu::LtType::f32;
  x.a = g.a;
  x.lda = g.lda;
  x.b = g.b;
  x.ldb = g.ldb;
  x.c = g.c;
  x.ldc = g.ldc;
  x.d = g.c;
  x.ldd = g.ldc;
  if (!with_epilogue || g.epi == Epi::none) return x;
  using E = kiln::cu::Epilogue;
  x.bias = g.bias;
  x.bias_f32 = true;
  switch (g.epi) {
    case Epi::bias_relu:
      x.epilogue = E::relu_aux_bias;
      x.aux = g.aux;
      x.aux_ld = kiln::cu::relu_mask_ld(g.n);
      break;
    case Epi::bias: x.epilogue = E::bias; break;
    case Epi::bgrada: x.epilogue = E::bgrada; break;
    case Epi::drelu_bgrad:
      x.epilogue = E::drelu_bgrad;
      x.aux = g.aux;
      x.aux_ld = kiln::cu::relu_mask_ld(g.n);
      break;
    case Epi::none: break;
  }
  return x;
}

// Whether cuBLASLt has a kernel for g's epilogue (runs it once): 1, 0, or -1 for a plain GEMM or a
// probe that failed for another reason (said on stderr).
int probe_lt(kiln::CudaExecutor& exec, const Gemm& g) {
  if (g.epi == Epi::none) return -1;
  try {
    exec.lt().matmul(lt_args(g, true), exec.stream());
    return 1;
  } catch (const kiln::cu::LtNoAlgorithm&) {
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step_cuda: probing cuBLASLt for %s (%s): %s\n", g.name, g.kind, e.what());
    return -1;
  }
}

std::vector<GemmResult> gemm_table(index_t batch, int reps, std::vector<Gemm>& list, kiln::CudaExecutor& exec,
                                   kiln_bench::GpuTimer& timer) {
  const index_t B = batch;
  DeviceBuf X(B * 400, 0.5f, exec), W1(256 * 400, 0.01f, exec), b1(256, 0.1f, exec), Y1(B * 256, 0, exec),
      W2(128 * 256, 0.01f, exec), b2(128, 0.1f, exec), Y2(B * 128, 0, exec), W3(10 * 128, 0.01f, exec),
      b3(10, 0.1f, exec), L(B * 10, 0, exec), dL(B * 10, 0.01f, exec), dW3(10 * 128, 0, exec), db3(10, 0, exec),
      dZ2(B * 128, 0, exec), db2(128, 0, exec), dW2(128 * 256, 0, exec), dZ1(B * 256, 0, exec), db1(256, 0, exec),
      dW1(256 * 400, 0, exec);
  // The ReLU masks, as floats: only their bytes matter (cuBLASLt's opaque bit-mask).
  auto mask = [&](index_t n) {
    const auto bytes = index_t(kiln::CudaExecutor::act_aux_bytes<kiln::fn::Relu, float>(B, n));
    return kiln::Tensor<float, kiln::cuda, kiln::dyn>(std::max<index_t>(1, (bytes + 3) / 4));
  };
  auto aux1 = mask(256), aux2 = mask(128);
  // y = x·wᵀ: exec.gemm(false, true, B, out, in, x, in, w, in, y, out) as ag::linear calls it;
  // dW = dZᵀ·x: (true, false, out, in, B, dz, out, x, in, dw, in); dX = dZ·W: (false, false, B, in, out, dz, out, w, in).
  list = {
      {"fc1_forward", "gemm+bias+relu", Epi::bias_relu, false, true, B, 256, 400, X.get(), 400, W1.get(), 400, Y1.get(), 256,
       b1.get(), aux1.data(), nullptr},
      {"fc2_forward", "gemm+bias+relu", Epi::bias_relu, false, true, B, 128, 256, Y1.get(), 256, W2.get(), 256, Y2.get(),
       128, b2.get(), aux2.data(), nullptr},
      {"fc3_forward", "gemm+bias", Epi::bias, false, true, B, 10, 128, Y2.get(), 128, W3.get(), 128, L.get(), 10,
       b3.get(), nullptr, nullptr},
      {"fc3_dw", "gemm+bgrada", Epi::bgrada, true, false, 10, 128, B, dL.get(), 10, Y2.get(), 128, dW3.get(), 128,
       db3.get(), nullptr, nullptr},
      {"fc3_dx", "gemm+drelu+bgrad", Epi::drelu_bgrad, false, false, B, 128, 10, dL.get(), 10, W3.get(), 128, dZ2.get(),
       128, db2.get(), aux2.data(), Y2.get()},
      {"fc2_dw", "gemm", Epi::none, true, false, 128, 256, B, dZ2.get(), 128, Y1.get(), 256, dW2.get(), 256, nullptr,
       nullptr, nullptr},
      {"fc2_dx", "gemm+drelu+bgrad", Epi::drelu_bgrad, false, false, B, 256, 128, dZ2.get(), 128, W2.get(), 256,
       dZ1.get(), 256, db1.get(), aux1.data(), Y1.get()},
      {"fc1_dw", "gemm", Epi::none, true, false, 256, 400, B, dZ1.get(), 256, X.get(), 400, dW1.get(), 400, nullptr,
       nullptr, nullptr},
  };
  // The forwards first, once: the masks the backward epilogues read.
  for (const Gemm& g : list) run_gemm(exec, g);
  exec.synchronize();
  std::vector<GemmResult> out;
  for (const Gemm& g : list) {
    GemmResult r{&g, 0, 0, 0, probe_lt(exec, g), 0, false};
    timer.reset_host_gaps();
    auto fused = [&](int) { run_gemm(exec, g); };
    auto plain = [&](int) { exec.lt().matmul(lt_args(g, false), exec.stream()); };
    r.calls = timer.calls_for(1e-3, 50, [](int) {}, fused);
    r.seconds = timer.per_call(3, reps, r.calls, fused);
    r.plain_seconds = timer.per_call(3, reps, r.calls, plain);
    exec.use_lt_epilogues(false);
    r.fallback_seconds = timer.per_call(3, reps, r.calls, fused);
    exec.use_lt_epilogues(true);
    // Re-run the forwards with cuBLASLt's epilogues: the masks the next backward GEMMs read.
    if (g.epi == Epi::bias_relu) run_gemm(exec, g);
    r.host_gaps = timer.host_gaps();
    out.push_back(r);
  }
  exec.synchronize();
  return out;
}

void print_gemm(const std::string& device, index_t batch, const GemmResult& r, int reps) {
  const Gemm& g = *r.g;
  const double flop = 2.0 * double(g.m) * double(g.n) * double(g.k);
  std::printf("{\"bench\": \"train_step_gemm\", \"backend\": \"cuda\", \"device\": \"%s\", \"batch\": %lld, "
              "\"gemm\": \"%s\", \"kind\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"trans_a\": %s, "
              "\"trans_b\": %s, \"dtype\": \"f32\", \"tf32\": false, \"seconds\": %.6g, \"tflops\": %.4f, "
              "\"plain_seconds\": %.6g, \"plain_tflops\": %.4f, \"fraction_of_plain_gemm\": %.4f, \"lt_epilogue\": %s, "
              "\"fallback_seconds\": %.6g, \"fallback_fraction_of_plain_gemm\": %.4f, \"calls\": %d, \"reps\": %d, "
              "\"host_gaps\": %s}\n",
              device.c_str(), (long long)batch, g.name, g.kind, (long long)g.m, (long long)g.n, (long long)g.k,
              g.ta ? "true" : "false", g.tb ? "true" : "false", r.seconds, flop / r.seconds * 1e-12, r.plain_seconds,
              flop / r.plain_seconds * 1e-12, r.plain_seconds / r.seconds,
              r.lt_epilogue < 0 ? "null" : (r.lt_epilogue ? "true" : "false"), r.fallback_seconds,
              r.plain_seconds / r.fallback_seconds, r.calls, reps, r.host_gaps ? "true" : "false");
}

// ---- the optimizer kernel against the copy ----------------------------------------------------

void optimizer_line(const std::string& device, int reps) {
  Setup s(64);
  s.step();  // gradients for every parameter
  s.exec.synchronize();
  kiln_bench::GpuTimer timer(s.exec.stream());
  kiln_bench::CopyReference copy(timer, reps);
  auto call = [&](int) { s.opt.step(s.exec); };
  // At most 4 steps per block: the optimizer rewrites its 4 pinned staging blocks in turn and
  // waits for the device before reusing one (a held stream would stall the 5th).
  const int calls = timer.calls_for(1e-3, 4, [](int) {}, call);
  const std::size_t before = s.exec.stats().launches();
  call(0);
  const double launches = double(s.exec.stats().launches() - before);
  const double seconds = timer.per_call(2, reps, calls, call);
  const double params = double(s.model.parameter_count());
  int tensors = 0;
  s.model.for_each_parameter([&](const auto&) { ++tensors; });
  const double read = 16.0 * params, written = 12.0 * params, bytes = read + written;
  const double copy_s = copy.seconds(std::size_t(bytes));
  std::printf("{\"bench\": \"train_step_optimizer\", \"backend\": \"cuda\", \"device\": \"%s\", \"op\": \"adamw\", "
              "\"params\": %.0f, \"tensors\": %d, \"seconds\": %.6g, \"read_bytes\": %.0f, \"written_bytes\": %.0f, "
              "\"bytes\": %.0f, \"gbps\": %.2f, \"copy_s\": %.6g, \"copy_gbps\": %.2f, \"fraction_of_copy\": %.4f, "
              "\"launches\": %.0f, \"calls\": %d, \"reps\": %d, \"host_gaps\": %s}\n",
              device.c_str(), params, tensors, seconds, read, written, bytes, bytes / seconds * 1e-9, copy_s,
              bytes / copy_s * 1e-9, copy_s / seconds, launches, calls, reps, timer.host_gaps() ? "true" : "false");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  int steps = 100, reps = 11, warmup = 50;
  std::string python = "python3";
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
  if (!kiln::cu::device_available()) return kiln::cu::report_no_device("train_step_cuda");
  const std::string device = kiln::cu::device_name();
  // PyTorch first, so that the two never share the device at the same time.
  const bool want_torch = !python.empty() && python != "none";
  const auto torch = want_torch ? torch_peer(python, "--device cuda --warmup " + std::to_string(warmup) +
                                                         " --steps " + std::to_string(steps) + " --reps " +
                                                         std::to_string(reps))
                                : std::map<long, double>{};
  for (long batch : {64L, 256L, 1024L}) {
    const KilnStep k = kiln_step(batch, warmup, steps, reps);
    std::vector<Gemm> list;
    std::vector<GemmResult> gemms;
    {
      kiln::CudaExecutor exec;
      kiln_bench::GpuTimer timer(exec.stream());
      gemms = gemm_table(batch, reps, list, exec, timer);
    }
    double gemm_s = 0;
    std::vector<std::pair<std::string, index_t>> listed;
    for (const GemmResult& r : gemms) {
      gemm_s += r.seconds;
      listed.emplace_back(r.g->kind, r.g->m * r.g->n);
    }
    std::sort(listed.begin(), listed.end());
    const bool matches = listed == k.gemms;
    if (!matches) {
      std::fprintf(stderr, "train_step_cuda: batch %ld: the step ran these GEMMs (launch name, m·n):", batch);
      for (const auto& [name, mn] : k.gemms) std::fprintf(stderr, " (%s, %lld)", name.c_str(), (long long)mn);
      std::fprintf(stderr, "; the GEMM table times others\n");
    }
    const auto it = torch.find(batch);
    std::printf("{\"bench\": \"train_step\", \"backend\": \"cuda\", \"device\": \"%s\", \"batch\": %ld, "
                "\"steps\": %d, \"reps\": %d, \"kiln_ms\": %.4f, ",
                device.c_str(), batch, steps, reps, k.ms);
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
    std::printf("}, \"gemm_ms\": %.4f, \"gemm_list_matches_step\": %s, ", gemm_s * 1e3, matches ? "true" : "false");
    if (std::isfinite(k.loss)) std::printf("\"loss\": %.6g}\n", double(k.loss));
    else std::printf("\"loss\": null}\n");  // JSON has no NaN
    for (const GemmResult& r : gemms) print_gemm(device, batch, r, reps);
    std::fflush(stdout);
  }
  optimizer_line(device, reps);
  if (want_torch && torch.empty() && kiln::cu::device_required()) {
    std::fprintf(stderr, "train_step_cuda: FAILED — KILN_REQUIRE_DEVICE is set and the PyTorch CUDA peer (%s) gave "
                         "no times\n", python.c_str());
    return 2;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_step_cuda: FAILED: %s\n", e.what());
  return 1;
}

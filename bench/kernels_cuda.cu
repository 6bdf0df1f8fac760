// bench/kernels_cuda.cu — kiln's row-wise kernels and the column-sum fallback on a CUDA device,
// each against the device-to-device copy bandwidth measured in the same run: softmax,
// log_softmax, layer_norm (with weight and bias) and cross_entropy, forward and backward,
// through kiln's public ops (kiln::nn on an ag::Tape over a kiln::CudaExecutor); and the
// executor's dact kernel — the column sums that stand in for cuBLASLt's BGRAD epilogues
// (fn::Identity: bias gradient only; fn::Relu: d = g·[out > 0] and its column sums) — at
// [256, 4096] and [8192, 1024], fp32; then BatchNorm2d forward and backward (training mode,
// NCHW) at two of ResNet-50's shapes (run_batch_norm: rows = N*C, cols = H*W in the JSON).
//
// Timing (bench/cuda_timing.cuh): device time by CUDA events on the executor's stream, the stream
// held until a block of calls is queued, so host-side costs do not count; a few warm-up calls,
// then the median of --reps blocks of `calls` calls (calls chosen so that a block lasts ~2 ms).
// Forward: the op under ag::NoGrad (nothing recorded). Backward: the op's forward is recorded
// before the block (not timed) with a scalar head on top — ag::sum of the output, or the loss
// itself for cross_entropy — and the block times tape.backward(head); the same is timed for the
// head alone (backward of ag::sum over a leaf of the output's shape: the seed kernel and the
// broadcast of the output gradient; for cross_entropy, backward of a scalar leaf: the seed
// kernel), and "seconds" is the difference: the op's backward kernels alone.
//
// Bytes: what the op must read plus what it must write, each operand once (counted in the
// JSON's read_bytes / written_bytes; "bytes" is their sum): e.g. softmax forward reads x and
// writes y (8·rows·cols), its backward reads g and y and writes dx (12·rows·cols); the small
// per-row and per-column vectors (mean, rstd, log-sum-exp, labels, weight, bias, their
// gradients) are counted too. The copy reference moves the same bytes (cudaMemcpyAsync of
// bytes / 2). [256, 4096] (4 MB per matrix) is L2-resident on an H200 (50 MB L2) for the kernel
// and the copy alike; [8192, 1024] (32 MB per matrix) mostly is not.
//
// One JSON line per (op, pass, shape): bench ("kernels"), backend ("cuda"), device, op, pass
// ("forward" | "backward"), dtype ("f32"), rows, cols, seconds, read_bytes, written_bytes, bytes,
// gbps, copy_s, copy_gbps, fraction_of_copy (copy_s / seconds), launches (kernel launches per
// call, from the executor's LaunchStats; backward: the op's, head excluded), calls, reps,
// total_s and head_s (backward only: the timed backward with its head, and the head alone),
// l2_bytes, host_gaps (true if a block outlasted the stream hold: its time includes host gaps).
// Without a device: a skip line, exit 0 (2 with KILN_REQUIRE_DEVICE set).
//
//   build/bench/kernels_cuda [--reps 11] [--shapes 256x4096,8192x1024]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "kiln/cuda.cuh"
#include "kiln/nn/cuda.cuh"

#include "cuda_timing.cuh"

namespace {

using Exec = kiln::CudaExecutor;
using Tape = kiln::ag::Tape<Exec>;
using Mat = kiln::ag::Var<float, kiln::cuda, kiln::dyn, kiln::dyn>;
using Vec = kiln::ag::Var<float, kiln::cuda, kiln::dyn>;
using Scalar = kiln::ag::Var<float, kiln::cuda>;
using Labels = kiln::Tensor<std::int32_t, kiln::cuda, kiln::dyn>;
using kiln::index_t;

constexpr double block_target_s = 2e-3;  // device time per timed block
constexpr int max_calls = 20;            // calls per block at most (backward: graphs alive at once)

struct Bench {
  Exec& exec;
  Tape& tape;
  kiln_bench::GpuTimer& timer;
  kiln_bench::CopyReference& copy;
  int reps;
  long long l2;
  std::string device;
};

struct Timed {
  double seconds = 0;  // per call
  double launches = 0;  // per call
  int calls = 0;
};

// Times call(i) (after prepare(calls)); launches per call from the executor's counters.
template <class Prepare, class Call>
Timed time_calls(Bench& b, Prepare&& prepare, Call&& call) {
  Timed t;
  t.calls = b.timer.calls_for(block_target_s, max_calls, prepare, call);
  prepare(1);
  const std::size_t before = b.exec.stats().launches();
  call(0);
  t.launches = double(b.exec.stats().launches() - before);
  t.seconds = b.timer.per_call(1, b.reps, t.calls, prepare, call);
  return t;
}

// The forward of op() (which returns the result; it dies before the next call) under NoGrad.
template <class Op>
Timed forward(Bench& b, Op&& op) {
  kiln::ag::NoGrad no_grad;
  return time_calls(b, [](int) {}, [&](int) { (void)op(); });
}

// tape.backward(make()) per call, the graphs recorded before each timed block; reset() runs before
// each backward (zero_grad of the leaves, so that every backward writes rather than accumulates).
template <class Make, class Reset>
Timed backward(Bench& b, Make&& make, Reset&& reset) {
  std::vector<Scalar> heads;
  auto prepare = [&](int n) {
    heads.clear();
    for (int i = 0; i < n; ++i) heads.push_back(make());
  };
  auto call = [&](int i) {
    reset();
    b.tape.backward(heads[std::size_t(i)]);
  };
  Timed t = time_calls(b, prepare, call);
  heads.clear();
  return t;
}

Mat random_matrix(Exec& exec, index_t rows, index_t cols, std::uint64_t seed, bool requires_grad) {
  kiln::Generator gen(seed);
  kiln::Tensor<float, kiln::host, kiln::dyn, kiln::dyn> h(rows, cols);
  for (index_t i = 0; i < h.size(); ++i) h.data()[i] = gen.uniform(-3.f, 3.f);
  return Mat(kiln::to_device(h, exec), requires_grad);
}

Vec filled_vector(Exec& exec, index_t n, float v, bool requires_grad) {
  kiln::Tensor<float, kiln::host, kiln::dyn> h(n);
  for (index_t i = 0; i < n; ++i) h.data()[i] = v;
  return Vec(kiln::to_device(h, exec), requires_grad);
}

void emit(Bench& b, const char* op, const char* pass, index_t rows, index_t cols, const Timed& t, double read,
          double written, const Timed* head = nullptr) {
  const double bytes = read + written;
  const double seconds = head ? t.seconds - head->seconds : t.seconds;
  const double copy_s = b.copy.seconds(std::size_t(bytes));
  std::printf("{\"bench\": \"kernels\", \"backend\": \"cuda\", \"device\": \"%s\", \"op\": \"%s\", \"pass\": \"%s\", "
              "\"dtype\": \"f32\", \"rows\": %lld, \"cols\": %lld, ",
              b.device.c_str(), op, pass, (long long)rows, (long long)cols);
  if (seconds > 0)
    std::printf("\"seconds\": %.6g, ", seconds);
  else
    std::printf("\"seconds\": null, ");  // the head took as long as the whole: noise
  std::printf("\"read_bytes\": %.0f, \"written_bytes\": %.0f, \"bytes\": %.0f, ", read, written, bytes);
  if (seconds > 0)
    std::printf("\"gbps\": %.2f, ", bytes / seconds * 1e-9);
  else
    std::printf("\"gbps\": null, ");
  std::printf("\"copy_s\": %.6g, \"copy_gbps\": %.2f, ", copy_s, bytes / copy_s * 1e-9);
  if (seconds > 0)
    std::printf("\"fraction_of_copy\": %.4f, ", copy_s / seconds);
  else
    std::printf("\"fraction_of_copy\": null, ");
  std::printf("\"launches\": %.0f, \"calls\": %d, \"reps\": %d, ", head ? t.launches - head->launches : t.launches,
              t.calls, b.reps);
  if (head) std::printf("\"total_s\": %.6g, \"head_s\": %.6g, ", t.seconds, head->seconds);
  std::printf("\"l2_bytes\": %lld, \"host_gaps\": %s}\n", b.l2, b.timer.host_gaps() ? "true" : "false");
  std::fflush(stdout);
  b.timer.reset_host_gaps();
}

void run_shape(Bench& b, index_t rows, index_t cols) {
  namespace nn = kiln::nn;
  namespace ag = kiln::ag;
  const double N = double(rows) * double(cols), F = sizeof(float), R = double(rows), C = double(cols);
  Exec& exec = b.exec;
  Tape& tape = b.tape;
  const Mat x = random_matrix(exec, rows, cols, 1, false);
  Mat xg = random_matrix(exec, rows, cols, 1, true);
  Mat z = random_matrix(exec, rows, cols, 2, true);  // the head's leaf
  Vec w = filled_vector(exec, cols, 1.f, true), bias = filled_vector(exec, cols, 0.f, true);
  Scalar s(kiln::Tensor<float, kiln::cuda>{}, true);  // cross_entropy's head: a scalar leaf
  kiln::Tensor<std::int32_t, kiln::host, kiln::dyn> hl(rows);
  kiln::Generator gen(3);
  for (index_t i = 0; i < rows; ++i) hl.data()[i] = std::int32_t(gen.below(std::uint64_t(cols)));
  const Labels labels = kiln::to_device(hl, exec);
  b.copy.reserve(std::size_t(3 * N * F + 4 * (R + C) * F));

  // Heads alone: backward of sum(z) (seed + broadcast of the gradient), and of a scalar leaf (seed).
  const Timed sum_head = backward(b, [&] { return ag::sum(tape, z); }, [&] { z.zero_grad(); });
  const Timed seed_head = backward(b, [&] { return s; }, [&] { s.zero_grad(); });
  b.timer.reset_host_gaps();

  {
    const Timed f = forward(b, [&] { return nn::softmax(tape, x); });
    emit(b, "softmax", "forward", rows, cols, f, N * F, N * F);
    const Timed g = backward(b, [&] { return ag::sum(tape, nn::softmax(tape, xg)); }, [&] { xg.zero_grad(); });
    emit(b, "softmax", "backward", rows, cols, g, 2 * N * F, N * F, &sum_head);
  }
  {
    const Timed f = forward(b, [&] { return nn::log_softmax(tape, x); });
    emit(b, "log_softmax", "forward", rows, cols, f, N * F, N * F);
    const Timed g = backward(b, [&] { return ag::sum(tape, nn::log_softmax(tape, xg)); }, [&] { xg.zero_grad(); });
    emit(b, "log_softmax", "backward", rows, cols, g, 2 * N * F, N * F, &sum_head);
  }
  {
    // Forward reads x, weight, bias; writes y and the saved mean, rstd.
    const Timed f = forward(b, [&] { return nn::layer_norm(tape, x, w, bias); });
    emit(b, "layer_norm", "forward", rows, cols, f, (N + 2 * C) * F, (N + 2 * R) * F);
    // Backward reads x, g, weight, mean, rstd; writes dx, dweight, dbias.
    const Timed g = backward(b, [&] { return ag::sum(tape, nn::layer_norm(tape, xg, w, bias)); },
                             [&] {
                               xg.zero_grad();
                               w.zero_grad();
                               bias.zero_grad();
                             });
    emit(b, "layer_norm", "backward", rows, cols, g, (2 * N + C + 2 * R) * F, (N + 2 * C) * F, &sum_head);
  }
  {
    // Forward reads the logits and labels; writes each row's log-sum-exp (kept) and the loss.
    const Timed f = forward(b, [&] { return nn::cross_entropy(tape, x, labels); });
    emit(b, "cross_entropy", "forward", rows, cols, f, (N + R) * F, (R + 1) * F);
    // Backward reads the logits, log-sum-exps, labels and the loss gradient; writes dlogits.
    const Timed g = backward(b, [&] { return nn::cross_entropy(tape, xg, labels); }, [&] { xg.zero_grad(); });
    emit(b, "cross_entropy", "backward", rows, cols, g, (N + 2 * R + 1) * F, N * F, &seed_head);
  }
  {
    // The executor's column-sum kernel (the fallback of cuBLASLt's BGRAD epilogues).
    kiln::Tensor<float, kiln::cuda, kiln::dyn> db(cols);
    kiln::Tensor<float, kiln::cuda, kiln::dyn, kiln::dyn> d(rows, cols);
    const float* g = x.value().data();
    const float* out = z.value().data();
    const Timed c = time_calls(b, [](int) {}, [&](int) {
      exec.dact<kiln::fn::Identity, float>(rows, cols, g, nullptr, nullptr, nullptr, false, db.data(), false);
    });
    emit(b, "column_sum", "backward", rows, cols, c, N * F, C * F);
    const Timed r = time_calls(b, [](int) {}, [&](int) {
      exec.dact<kiln::fn::Relu, float>(rows, cols, g, nullptr, out, d.data(), false, db.data(), false);
    });
    emit(b, "drelu_column_sum", "backward", rows, cols, r, 2 * N * F, (N + C) * F);
  }
}

// BatchNorm2d<C> (NCHW, training mode: the batch statistics, the running ones' update, then the
// normalising pass; backward: the per-channel sums with dweight and dbias, then dx) on a batch of
// n images, against the copy of the same bytes: forward reads x and writes y, backward reads x
// and dy and writes dx (each operand once; the per-channel vectors are counted too). The
// statistics read x twice (mean, then the variance about it) and the backward recomputes the
// normalised value, so the fraction of copy these reach is bounded below 1 by design.
template <index_t C, index_t H, index_t W>
void run_batch_norm(Bench& b, index_t n) {
  namespace nn = kiln::nn;
  namespace ag = kiln::ag;
  using Img = ag::Var<float, kiln::cuda, kiln::dyn, C, H, W>;
  const double N = double(n) * double(C * H * W), F = sizeof(float), Cd = double(C);
  kiln::Tensor<float, kiln::host, kiln::dyn, C, H, W> h(kiln::Shape{n, C, H, W});
  kiln::Generator gen(5);
  for (index_t i = 0; i < h.size(); ++i) h.data()[i] = gen.uniform(-3.f, 3.f);
  const Img x(kiln::to_device(h, b.exec), false);
  Img xg(kiln::to_device(h, b.exec), true);
  Img z(kiln::to_device(h, b.exec), true);  // the head's leaf
  const nn::BatchNorm2d<C, float, kiln::cuda> bn;
  b.copy.reserve(std::size_t(3 * N * F + 8 * Cd * F));
  const Timed head = backward(b, [&] { return ag::sum(b.tape, z); }, [&] { z.zero_grad(); });
  b.timer.reset_host_gaps();
  // Forward: x, weight, bias and the running statistics read; y, the saved mean and 1/std and the
  // running statistics written.
  const Timed f = forward(b, [&] { return bn.forward(b.tape, x); });
  emit(b, "batch_norm", "forward", n * C, H * W, f, (N + 4 * Cd) * F, (N + 4 * Cd) * F);
  // Backward: x, dy, weight, bias, mean, 1/std read; dx, dweight, dbias written.
  const Timed g = backward(b, [&] { return ag::sum(b.tape, bn.forward(b.tape, xg)); }, [&] { xg.zero_grad(); });
  emit(b, "batch_norm", "backward", n * C, H * W, g, (2 * N + 4 * Cd) * F, (N + 2 * Cd) * F, &head);
}

}  // namespace

int main(int argc, char** argv) try {
  int reps = 11;
  std::vector<std::pair<index_t, index_t>> shapes{{256, 4096}, {8192, 1024}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else if (a == "--shapes") {
      shapes.clear();
      const std::string list = argv[i + 1];
      for (std::size_t p = 0; p < list.size();) {
        const std::size_t comma = std::min(list.find(',', p), list.size());
        long long r = 0, c = 0;
        if (std::sscanf(list.substr(p, comma - p).c_str(), "%lldx%lld", &r, &c) == 2 && r > 0 && c > 0)
          shapes.emplace_back(index_t(r), index_t(c));
        p = comma + 1;
      }
    }
  }
  if (reps < 1 || shapes.empty()) {
    std::fprintf(stderr, "kernels_cuda: --reps must be positive and --shapes a list like 256x4096,8192x1024\n");
    return 2;
  }
  if (!kiln::cu::device_available()) return kiln::cu::report_no_device("kernels_cuda");
  Exec exec;
  Tape tape(exec);
  kiln_bench::GpuTimer timer(exec.stream());
  kiln_bench::CopyReference copy(timer, reps);
  Bench b{exec, tape, timer, copy, reps, kiln_bench::l2_bytes(), kiln::cu::device_name()};
  for (const auto& [rows, cols] : shapes) run_shape(b, rows, cols);
  // Batch norm at two of ResNet-50's shapes, batch 32: layer1's 64 x 56 x 56 (25.7 MB per tensor:
  // few channels, long planes: each channel's sums split into 16 parts of 6,272, kiln/core/row_parts.hpp)
  // and layer4's 512 x 7 x 7 (a block per channel).
  run_batch_norm<64, 56, 56>(b, 32);
  run_batch_norm<512, 7, 7>(b, 32);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "kernels_cuda: FAILED: %s\n", e.what());
  return 1;
}

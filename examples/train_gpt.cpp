// train_gpt — nanoGPT's character-level "baby GPT" on tinyshakespeare, with nanoGPT's CPU settings:
// 4 layers, 4 heads, width 128, block 64, batch 12, 2000 iterations, AdamW (lr 1e-3, beta2 0.99,
// weight decay 0.1 on the matrices), gradients clipped at 1.0, 100 warmup iterations and a cosine
// to 1e-4, no dropout (nanoGPT's README: `--device=cpu --compile=False --eval_iters=20
// --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000
// --lr_decay_iters=2000 --dropout=0.0`, validation loss 1.88).
//
//   build/examples/train_gpt --data-dir data [--iters 2000] [--batch 12] [--lr 1e-3] [--min-lr 1e-4]
//     [--warmup 100] [--weight-decay 0.1] [--clip 1.0] [--eval-every 250] [--eval-iters 20]
//     [--sample 200] [--seed 0] [--threads 1] [--mode reduce_overhead|default] [--precision fp32|bf16_mixed]
//
// --precision bf16_mixed: activations in bfloat16, float master weights, statistics, softmax and
// attention's arithmetic in float (on the CPU an exact emulation: bf16 storage, float arithmetic).
//
// Where nvcc built it and a CUDA device exists it trains there (kiln's own attention kernels,
// fp32; the gradient clipping without a host wait, so reduce_overhead captures the whole step as
// one CUDA graph); else on the CPU with --threads threads. It says which.
//
// --mode reduce_overhead (the default, torch.compile's mode="reduce-overhead"): the step at its one
// shape is captured once and replayed — no tape, no allocation — with the same results bit for bit
// as --mode default, which runs every step through the tape.
// Every --eval-every iterations (and at the end) it estimates the train and validation losses over
// --eval-iters random batches each (nanoGPT's estimate_loss), then prints --sample characters drawn
// from the model after "\n" (temperature 1, top-k 200 as nanoGPT's sample.py). The closing lines:
// `final val loss X`, the median milliseconds per iteration, and the kernels per training step,
// measured and predicted at compile time.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

// One policy, the fused stance: the ops' unfused force_eager forms are not compiled.
#define KILN_FORCE_EAGER_FORMS 0
#include "kiln/data/text.hpp"
#include "kiln/models/gpt.hpp"
#include "kiln/models/gpt_sample.hpp"
#include "kiln/train.hpp"
#if KILN_CUDA_COMPILER
#include "kiln/optim/cuda_clip.cuh"
#include "kiln/train.cuh"
#endif

#include "cli.hpp"

namespace {

using namespace kiln;

constexpr models::GptConfig config{.vocab = 65, .block_size = 64, .layers = 4, .heads = 4, .width = 128};
using Model = models::GPT<config>;
constexpr index_t T = config.block_size;

struct Options {
  index_t iters = 2000, batch = 12, warmup = 100, eval_every = 250, eval_iters = 20, sample = 200;
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, clip = 1.0;
  std::uint64_t seed = 0;
  int threads = 1;
  std::string data_dir = "data", mode = "reduce_overhead", precision = "fp32";
};

// nanoGPT's get_lr: linear warmup (it + 1) / (warmup + 1), then a cosine from lr to min_lr at `total`.
struct NanoGptLr {
  index_t warmup, total;
  double base_lr, min_lr;
  double lr(index_t it) const {
    if (it < warmup) return base_lr * double(it + 1) / double(warmup + 1);
    if (it > total) return min_lr;
    const double ratio = double(it - warmup) / double(std::max<index_t>(total - warmup, 1));
    return min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (base_lr - min_lr);
  }
  index_t total_steps() const { return total; }
};

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// Copies a host vector into memory of Space (on a device: ordered on the executor's stream; a
// pageable source is consumed before the call returns, so it can be refilled at once).
template <class Space, class V>
void upload(typename V::value_type* dst, const V& src, executor_t<Space>& exec) {
  if constexpr (std::is_same_v<Space, host>) {
    (void)exec;
    std::copy(src.begin(), src.end(), dst);
  } else {
#if KILN_CUDA_COMPILER
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(typename V::value_type),
                                    cudaMemcpyHostToDevice, exec.stream()));
#endif
  }
}

// nanoGPT's estimate_loss for one split: the mean loss of `iters` random batches, in eval mode.
template <class M, class Exec>
double estimate_loss(M& model, Exec& exec, const data::TokenWindows& windows, index_t batch, index_t iters,
                     Generator& gen) {
  using S = typename Exec::space;
  nn::EvalScope evaluating(model);
  ag::Tape<Exec> tape(exec);
  std::vector<float> x;
  std::vector<std::int32_t> y;
  ag::Var<float, S, dyn, T> input(Tensor<float, S, dyn, T>(Shape{batch, T}));
  Tensor<std::int32_t, S, dyn> labels(Shape{batch * T});
  double sum = 0;
  for (index_t i = 0; i < iters; ++i) {
    windows.sample(batch, gen, x, y);
    upload<S>(input.value().data(), x, exec);
    upload<S>(labels.data(), y, exec);
    sum += double(train::CrossEntropy{}(tape, model.forward(tape, input), labels.data()).item());
  }
  return sum / double(iters);
}

// Samples on the CPU (the key/value cache is the host's): a device model's parameters are copied
// into a host model first.
template <class M>
void print_sample(const M& model, const data::CharTokenizer& tok, index_t n, std::uint64_t seed) {
  if (n <= 0) return;
  Model host_model(seed);
  if constexpr (std::is_same_v<typename M::space, host>) {
    host_model = model;
  } else {
#if KILN_CUDA_COMPILER
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<const float*> from;
    model.for_each_parameter([&](const auto& v) { from.push_back(v.value().data()); });
    std::size_t k = 0;
    host_model.for_each_parameter([&](const auto& v) {
      KILN_CUDA_CHECK(cudaMemcpy(v.value().data(), from[k++], std::size_t(v.value().size()) * sizeof(float),
                                 cudaMemcpyDeviceToHost));
    });
#endif
  }
  CpuExecutor exec(1);
  const auto ids = models::generate(host_model, exec, tok.encode("\n"), n, {.temperature = 1.0, .top_k = 200, .seed = seed});
  std::printf("sample:\n%s\n---\n", tok.decode(ids).c_str());
}

template <class Space, class Policy>
int run(const Options& o) {
  const std::string path = o.data_dir + "/tinyshakespeare.txt.gz";
  const std::string text = data::read_text(path);
  const auto tok = data::CharTokenizer::from_text(text);
  KILN_CHECK(tok.size() <= config.vocab, ValueError, path, " has ", tok.size(), " distinct characters; this program's model ",
             "is built for at most ", config.vocab, " (GptConfig::vocab in examples/train_gpt.cpp)");
  auto [train_ids, val_ids] = data::split_tokens(tok.encode(text), 0.9);
  const data::TokenWindows train_windows(std::move(train_ids), T, path + " (train, first 90%)");
  const data::TokenWindows val_windows(std::move(val_ids), T, path + " (validation, last 10%)");
  std::printf("data: %s, %lld characters, vocabulary %lld; %lld train / %lld validation tokens\n", path.c_str(),
              (long long)text.size(), (long long)tok.size(), (long long)train_windows.tokens(),
              (long long)val_windows.tokens());

  auto exec = make_executor<Space>(o.threads);
  typename Model::template on<Space> model(o.seed);
  optim::AdamW opt(model, {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = o.weight_decay});
  train::StepOptions options;
  if (o.clip > 0) {
    if constexpr (std::is_same_v<Space, host>) {
      options.after_backward = [&](index_t) { optim::clip_grad_norm(opt.table(), o.clip, exec); };
    } else {
#if KILN_CUDA_COMPILER
      options.after_backward = [&](index_t) { optim::cuda_clip_grad_norm_on_device(opt.device_table(), o.clip, exec); };
#endif
    }
  }
  train::Step step(model, opt, exec, Policy{}, train::CrossEntropy{}, options);
  step.set_schedule(NanoGptLr{o.warmup, o.iters, o.lr, o.min_lr}, o.iters);
  constexpr bool on_host = std::is_same_v<Space, host>;
  const std::string where =
      on_host ? std::to_string(o.threads) + (o.threads == 1 ? " thread" : " threads") : std::string("the GPU");
  std::printf("model: %s\nstep: %s; %s\n", model.describe().c_str(), step.describe().c_str(), where.c_str());

  Generator batches(o.seed), evals(o.seed + 1);
  std::vector<float> x;
  std::vector<std::int32_t> y;
  // The step reads its batch from the model's space.
  Tensor<float, Space, dyn> batch_x(Shape{o.batch * T});
  Tensor<std::int32_t, Space, dyn> batch_y(Shape{o.batch * T});
  std::vector<double> iteration_ms;
  double val_loss = 0;
  for (index_t it = 0; it <= o.iters; ++it) {
    if (it % o.eval_every == 0 || it == o.iters) {
      const double tl = estimate_loss(model, exec, train_windows, o.batch, o.eval_iters, evals);
      val_loss = estimate_loss(model, exec, val_windows, o.batch, o.eval_iters, evals);
      std::vector<double> recent = iteration_ms;
      std::sort(recent.begin(), recent.end());
      std::printf("iter %5lld: train loss %.4f, val loss %.4f, lr %.2e%s\n", (long long)it, tl, val_loss, opt.lr(),
                  recent.empty() ? "" : (", " + std::to_string(recent[recent.size() / 2]).substr(0, 6) + " ms per iteration").c_str());
      std::fflush(stdout);
    }
    if (it == o.iters) break;
    if (it == o.iters - 1) step.record_next_step();
    train_windows.sample(o.batch, batches, x, y);
    const auto t0 = std::chrono::steady_clock::now();
    upload<Space>(batch_x.data(), x, exec);
    upload<Space>(batch_y.data(), y, exec);
    step.run(batch_x.data(), batch_y.data(), o.batch, T);
    if constexpr (!on_host) exec.synchronize();  // the iteration's time, not its launches'
    iteration_ms.push_back(ms_since(t0));
  }
  (void)step.take_losses(/*require_finite=*/true);
  std::printf("%s", step.mode_report().c_str());
  print_sample(model, tok, o.sample, o.seed);
  std::sort(iteration_ms.begin(), iteration_ms.end());
  const auto rep = train::report(step);
  std::printf("%sfinal val loss %.4f; median %.2f ms per iteration (batch %lld x %lld tokens, %s)\n"
              "%.1f kernels per training step (%lld predicted at compile time; the gradient clipping this program "
              "adds runs its norm and, when it clips, its scaling: 1 or 2 more)\n",
              rep.str().c_str(), val_loss, iteration_ms.empty() ? 0.0 : iteration_ms[iteration_ms.size() / 2],
              (long long)o.batch, (long long)T, where.c_str(), rep.kernels_per_step,
              (long long)rep.predicted);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  kiln_example::Flags flags;
  flags.add("--iters", o.iters, kiln_example::positive);
  flags.add("--batch", o.batch, kiln_example::positive);
  flags.add("--lr", o.lr, kiln_example::positive);
  flags.add("--min-lr", o.min_lr, kiln_example::non_negative);
  flags.add("--warmup", o.warmup, kiln_example::non_negative);
  flags.add("--weight-decay", o.weight_decay, kiln_example::non_negative);
  flags.add("--clip", o.clip, kiln_example::non_negative);
  flags.add("--eval-every", o.eval_every, kiln_example::positive);
  flags.add("--eval-iters", o.eval_iters, kiln_example::positive);
  flags.add("--sample", o.sample, kiln_example::non_negative);
  flags.add("--seed", o.seed);
  flags.add("--threads", o.threads, kiln_example::positive);
  flags.add("--data-dir", o.data_dir);
  flags.add("--mode", o.mode);
  flags.add("--precision", o.precision);
  flags.parse(argc, argv,
              "usage: train_gpt [--data-dir DIR] [--iters N] [--batch N] [--lr X] [--min-lr X] [--warmup N] "
              "[--weight-decay X] [--clip X] [--eval-every N] [--eval-iters N] [--sample N] [--seed N] [--threads N] "
              "[--mode reduce_overhead|default] [--precision fp32|bf16_mixed]\n"
              "Trains nanoGPT's character-level baby GPT (4 layers, 4 heads, width 128, block 64) on "
              "DIR/tinyshakespeare.txt.gz with nanoGPT's CPU settings; --clip 0 turns clipping off. --mode "
              "reduce_overhead (the default) captures the step once and replays it; default runs it through the tape.\n");
  KILN_CHECK(o.warmup <= o.iters, ValueError, "--warmup (", o.warmup, ") must not exceed --iters (", o.iters, ")");
  KILN_CHECK(o.mode == "reduce_overhead" || o.mode == "default", ValueError,
             "--mode must be reduce_overhead or default, got \"", o.mode, "\"");
  KILN_CHECK(o.precision == "fp32" || o.precision == "bf16_mixed", ValueError,
             "--precision must be fp32 or bf16_mixed, got \"", o.precision, "\"");
  const bool bf16 = o.precision == "bf16_mixed";
  auto train_on = [&]<class Space>() {
    using kiln::mode::reduce_overhead;
    using kiln::precision::bf16_mixed;
    if (bf16 && o.mode == "reduce_overhead") return run<Space, kiln::policy<bf16_mixed, reduce_overhead>>(o);
    if (bf16) return run<Space, kiln::policy<bf16_mixed>>(o);
    if (o.mode == "reduce_overhead") return run<Space, kiln::policy<reduce_overhead>>(o);
    return run<Space, kiln::policy<>>(o);
  };
#if KILN_CUDA_COMPILER
  if (cu::device_available()) {
    std::printf("device: CUDA (%s)\n", cu::device_name().c_str());
    return train_on.template operator()<kiln::cuda>();
  }
  if (kiln::device_required()) return cu::report_no_device("train_gpt");  // KILN_REQUIRE_DEVICE
  std::printf("device: CPU, %d thread%s (no CUDA device: %s)\n", o.threads, o.threads == 1 ? "" : "s",
              cu::device_unavailable_reason().c_str());
#else
  KILN_CHECK(!kiln::device_required(), ValueError, "KILN_REQUIRE_DEVICE is set, but this build has no CUDA");
#endif
  return train_on.template operator()<kiln::host>();
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_gpt: %s\n", e.what());
  return 1;
}

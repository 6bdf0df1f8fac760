// train_digits — the main job: an MLP 400-256-128-10 learns the digits20 set (20×20 MNIST
// digits) with AdamW. Built by nvcc (when the toolkit exists) it trains on the GPU if one is
// present and says so; otherwise, and in host-only builds, on the CPU backend.
//
//   build/examples/train_digits --data-dir data [--epochs 10] [--batch 64] [--lr 1e-3]
//                               [--seed 0] [--threads 1]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kiln.hpp"
#include "kiln/data/idx.hpp"
#include "kiln/data/loader.hpp"
#include "kiln/data/normalize.hpp"
#include "kiln/nn/activation.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/nn/sequential.hpp"
#include "kiln/optim/adam.hpp"
#if KILN_CUDA_COMPILER
#include "kiln/cuda.cuh"
#include "kiln/data/device_loader.cuh"
#include "kiln/nn/cuda.cuh"
#include "kiln/optim/cuda_step.cuh"
#endif

namespace {

struct Options {
  int epochs = 10;
  kiln::index_t batch = 64;
  double lr = 1e-3;
  std::uint64_t seed = 0;
  int threads = 1;
  std::string data_dir = "data";
};

void usage() {
  std::printf(
      "usage: train_digits [--epochs N] [--batch N] [--lr X] [--seed N] [--threads N] [--data-dir DIR]\n"
      "Trains an MLP 400-256-128-10 (ReLU, AdamW, cross-entropy) on digits20 and reports test accuracy.\n"
      "  --epochs N     passes over the 4,000 training digits (default 10)\n"
      "  --batch N      batch size (default 64)\n"
      "  --lr X         AdamW learning rate (default 1e-3)\n"
      "  --seed N       seed for initialisation and shuffling (default 0)\n"
      "  --threads N    CPU threads (default 1, as the PyTorch reference)\n"
      "  --data-dir DIR folder with digits20-{train,test}-{images-idx3,labels-idx1}-ubyte.gz (default data)\n");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw kiln::ValueError("option " + a + " needs a value (see --help)");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else if (a == "--epochs") {
      o.epochs = std::stoi(value());
    } else if (a == "--batch") {
      o.batch = std::stoll(value());
    } else if (a == "--lr") {
      o.lr = std::stod(value());
    } else if (a == "--seed") {
      o.seed = std::stoull(value());
    } else if (a == "--threads") {
      o.threads = std::stoi(value());
    } else if (a == "--data-dir") {
      o.data_dir = value();
    } else {
      throw kiln::ValueError("unknown option " + a + " (see --help)");
    }
  }
  KILN_CHECK(o.epochs > 0 && o.batch > 0 && o.lr > 0 && o.threads > 0, kiln::ValueError,
             "--epochs, --batch, --lr and --threads must be positive");
  return o;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Steps between reads of the losses (and progress-bar updates).
constexpr kiln::index_t loss_window = 8;

using Model = kiln::nn::Sequential<kiln::nn::Linear<400, 256>, kiln::nn::ReLU, kiln::nn::Linear<256, 128>,
                                   kiln::nn::ReLU, kiln::nn::Linear<128, 10>>;

// What differs between the backends: where batches and parameters live. The training loop
// below is the same code for both.
struct CpuBackend {
  using Exec = kiln::CpuExecutor;
  using Net = Model;
  Exec exec;
  Net model;
  kiln::optim::AdamW optimizer;
  kiln::data::Loader loader;
  CpuBackend(const Options& o, const kiln::data::Dataset& train)
      : exec(o.threads),
        model(o.seed),
        optimizer(model.param_table(), {.lr = o.lr}),
        loader(train, {.batch_size = o.batch, .seed = o.seed, .workers = 0}) {}
  void start_epoch(int e) { loader.start_epoch(e); }
  // Copies the next batch into x; returns its labels (nullptr at the end of the epoch).
  const std::int32_t* next(kiln::ag::Var<float, kiln::host, kiln::dyn, 400>& x) {
    const kiln::data::Batch* b = loader.next();
    if (!b) return nullptr;
    x.value().resize(kiln::Shape{b->size, 400});
    std::memcpy(x.value().data(), b->features.data(), b->features.size_bytes());
    return b->labels.data();
  }
  // Losses are kept until the loop reads them (every loss_window steps): on the CPU that costs
  // nothing; on CUDA it keeps the host from waiting for the device every step.
  void record_loss(const kiln::ag::Var<float, kiln::host>& loss) { losses.push_back(loss.value().data()[0]); }
  std::vector<float> take_losses() { return std::exchange(losses, {}); }
  std::size_t losses_pending() const { return losses.size(); }
  std::vector<float> losses;
  void step() { optimizer.step(exec); }
  double wait_seconds() const { return loader.wait_seconds(); }
  kiln::Tensor<std::int64_t, kiln::host, kiln::dyn> predict(const kiln::data::Dataset& ds,
                                                            kiln::ag::Tape<Exec>& tape) {
    kiln::nn::EvalScope evaluating(model);  // eval mode, nothing recorded; train mode again after
    kiln::ag::Var<float, kiln::host, kiln::dyn, 400> x(kiln::Tensor<float, kiln::host, kiln::dyn, 400>(ds.n, 400));
    std::memcpy(x.value().data(), ds.features.data(), ds.features.size() * sizeof(float));
    auto logits = model.forward(tape, x);
    kiln::Tensor<std::int64_t, kiln::host, kiln::dyn> pred(ds.n);
    kiln::assign(pred, kiln::argmax<kiln::reduce_over::last_axis>(logits.value()), exec);
    return pred;
  }
};

#if KILN_CUDA_COMPILER
struct CudaBackend {
  using Exec = kiln::CudaExecutor;
  using Net = Model::on<kiln::cuda>;
  Exec exec;
  Net model;
  kiln::optim::CudaAdamW optimizer;
  kiln::data::Loader host_loader;
  kiln::data::DeviceLoader loader;
  CudaBackend(const Options& o, const kiln::data::Dataset& train)
      : exec(),
        model(o.seed),
        optimizer(model.param_table(), {.lr = o.lr}),
        host_loader(train, {.batch_size = o.batch, .seed = o.seed}),
        loader(host_loader, exec.stream()) {}
  void start_epoch(int e) { loader.start_epoch(e); }
  const std::int32_t* next(kiln::ag::Var<float, kiln::cuda, kiln::dyn, 400>& x) {
    const kiln::data::DeviceBatch* b = loader.next();
    if (!b) return nullptr;
    x.value().resize(kiln::Shape{b->size, 400});
    KILN_CUDA_CHECK(cudaMemcpyAsync(x.value().data(), b->features, std::size_t(b->size) * 400 * sizeof(float),
                                    cudaMemcpyDeviceToDevice, exec.stream()));
    return b->labels;
  }
  // Each step's loss is copied (device to device, no kernel) into a window the host reads every
  // loss_window steps: one synchronisation per window instead of one per step.
  kiln::Tensor<float, kiln::cuda, kiln::dyn> window{kiln::Shape{loss_window}};
  std::size_t pending = 0;
  void record_loss(const kiln::ag::Var<float, kiln::cuda>& loss) {
    KILN_CHECK(pending < std::size_t(loss_window), kiln::ValueError, "train_digits: the loss window is full");
    KILN_CUDA_CHECK(cudaMemcpyAsync(window.data() + pending, loss.value().data(), sizeof(float),
                                    cudaMemcpyDeviceToDevice, exec.stream()));
    ++pending;
  }
  std::vector<float> take_losses() {
    std::vector<float> out(pending);
    if (pending > 0)
      KILN_CUDA_CHECK(cudaMemcpyAsync(out.data(), window.data(), pending * sizeof(float), cudaMemcpyDeviceToHost,
                                      exec.stream()));
    exec.synchronize();
    pending = 0;
    return out;
  }
  std::size_t losses_pending() const { return pending; }
  void step() { optimizer.step(exec); }
  double wait_seconds() const { return loader.wait_seconds(); }
  kiln::Tensor<std::int64_t, kiln::host, kiln::dyn> predict(const kiln::data::Dataset& ds,
                                                            kiln::ag::Tape<Exec>& tape) {
    kiln::nn::EvalScope evaluating(model);  // eval mode, nothing recorded; train mode again after
    kiln::Tensor<float, kiln::host, kiln::dyn, 400> hx(ds.n, 400);
    std::memcpy(hx.data(), ds.features.data(), ds.features.size() * sizeof(float));
    kiln::ag::Var<float, kiln::cuda, kiln::dyn, 400> x(kiln::to_device(hx));
    auto logits = model.forward(tape, x);
    kiln::Tensor<std::int64_t, kiln::cuda, kiln::dyn> pred(ds.n);
    kiln::assign(pred, kiln::argmax<kiln::reduce_over::last_axis>(logits.value()), exec);
    exec.synchronize();
    return kiln::to_host(pred);
  }
};
#endif

void progress(int epoch, int epochs, kiln::index_t step, kiln::index_t steps, double secs, double loss) {
  const int width = 24, done = int(width * step / std::max<kiln::index_t>(steps, 1));
  std::printf("\repoch %2d/%d [%.*s%*s] %3lld/%lld  %6.0f steps/s  loss %.4f", epoch + 1, epochs, done,
              "########################", width - done, "", (long long)step, (long long)steps,
              secs > 0 ? double(step) / secs : 0.0, loss);
  std::fflush(stdout);
}

template <class Backend>
double accuracy(Backend& be, kiln::ag::Tape<typename Backend::Exec>& tape, const kiln::data::Dataset& ds) {
  const auto pred = be.predict(ds, tape);
  kiln::index_t right = 0;
  for (kiln::index_t i = 0; i < ds.n; ++i) right += pred(i) == ds.labels[std::size_t(i)];
  return ds.n ? double(right) / double(ds.n) : 0.0;
}

template <class Backend>
void train_on(const Options& opt, const kiln::data::Dataset& train, const kiln::data::Dataset& test) {
  Backend be(opt, train);
  std::printf("model: %s\n", be.model.describe().c_str());
  kiln::ag::Tape<typename Backend::Exec> tape(be.exec);
  kiln::ag::Var<float, typename Backend::Exec::space, kiln::dyn, 400> x;
  std::vector<double> epoch_seconds;
  kiln::index_t global_step = 0, measured_steps = 0;
  kiln::LaunchStats step_stats;
  const kiln::index_t per_epoch = (train.n + opt.batch - 1) / opt.batch;
  const auto start = Clock::now();
  for (int epoch = 0; epoch < opt.epochs; ++epoch) {
    const auto t0 = Clock::now();
    be.start_epoch(epoch);
    double loss_sum = 0;
    kiln::index_t steps = 0;
    if (epoch == opt.epochs - 1) be.exec.stats().reset();  // the fusion report counts the last epoch
    while (const std::int32_t* labels = be.next(x)) {
      auto logits = be.model.forward(tape, x);
      auto loss = kiln::nn::cross_entropy(tape, logits, labels);
      be.record_loss(loss);
      be.model.zero_grad();
      tape.backward(loss);
      be.step();
      ++steps;
      ++global_step;
      if (be.losses_pending() == std::size_t(loss_window) || steps == per_epoch) {
        // The window's first non-finite loss names its step; later steps in the window only
        // carried it on.
        const std::vector<float> window = be.take_losses();
        for (std::size_t i = 0; i < window.size(); ++i) {
          const kiln::index_t at = global_step - kiln::index_t(window.size() - i);
          KILN_CHECK(std::isfinite(window[i]), kiln::NumericError, "the loss is ", window[i], " at step ", at,
                     " (epoch ", epoch + 1, "): training diverged; lower --lr");
          loss_sum += window[i];
        }
        progress(epoch, opt.epochs, steps, per_epoch, seconds_since(t0), loss_sum / double(steps));
      }
    }
    if (epoch == opt.epochs - 1) {
      step_stats = be.exec.stats();
      measured_steps = steps;
    }
    const double secs = seconds_since(t0);
    epoch_seconds.push_back(secs);
    const double acc = accuracy(be, tape, test);
    std::printf("\repoch %2d/%d  train loss %.4f  test accuracy %.4f  %.3f s%*s\n", epoch + 1, opt.epochs,
                loss_sum / double(std::max<kiln::index_t>(steps, 1)), acc, secs, 30, "");
  }
  const double total = seconds_since(start);
  std::vector<double> sorted = epoch_seconds;
  std::sort(sorted.begin(), sorted.end());
  const double final_acc = accuracy(be, tape, test);
  std::printf("final test accuracy %.4f; total %.2f s; median epoch %.4f s; waited for data %.4f s\n", final_acc,
              total, sorted[sorted.size() / 2], be.wait_seconds());
  std::printf("fusion report: %.1f kernels per training step:", double(step_stats.launches()) / double(measured_steps));
  for (const auto& [k, n] : step_stats.by_kind()) std::printf(" %.1f %s", double(n) / double(measured_steps), k.c_str());
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  const std::string dir = opt.data_dir + "/";
  auto train = kiln::data::load_idx_classification(dir + "digits20-train-images-idx3-ubyte.gz",
                                                   dir + "digits20-train-labels-idx1-ubyte.gz", 10);
  auto test = kiln::data::load_idx_classification(dir + "digits20-test-images-idx3-ubyte.gz",
                                                  dir + "digits20-test-labels-idx1-ubyte.gz", 10);
  // MNIST-style global standardisation (one mean and std from the training set).
  auto norm = kiln::data::fit_normalizer(train, {.scale = 1.0f / 255, .standardize = kiln::data::Standardize::global});
  norm.apply(train);
  norm.apply(test);

  std::printf("data: %lld train / %lld test digits, %lld features; MLP 400-256-128-10, AdamW lr %g, batch %lld\n",
              (long long)train.n, (long long)test.n, (long long)train.d, opt.lr, (long long)opt.batch);
#if KILN_CUDA_COMPILER
  if (kiln::cu::device_available()) {
    std::printf("device: CUDA (%s)\n", kiln::cu::device_name().c_str());
    train_on<CudaBackend>(opt, train, test);
    return 0;
  }
  std::printf("device: CPU, %d thread%s (no CUDA device: %s)\n", opt.threads, opt.threads == 1 ? "" : "s",
              kiln::cu::device_unavailable_reason().c_str());
#else
  std::printf("device: CPU, %d thread%s (this build has no CUDA: nvcc was not found)\n", opt.threads,
              opt.threads == 1 ? "" : "s");
#endif
  train_on<CpuBackend>(opt, train, test);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_digits: %s\n", e.what());
  return 1;
}

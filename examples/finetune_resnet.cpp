// finetune_resnet — the workload kiln exists for: fine-tune torchvision's ResNet-50 on a folder of
// images, in mixed precision, within a memory budget.
//
//   build/examples/finetune_resnet --data-dir DIR [--weights FILE] [--arch resnet50] [--train-from layer4]
//     [--precision fp32|tf32|bf16_mixed] [--batch 128] [--accumulate N] [--epochs 2] [--lr 3e-4]
//     [--warmup-steps N] [--plan] [--memory-budget 8GiB] [--workers 2] [--threads 2] [--seed 0]
//     [--val-fraction 0.2] [--save-weights FILE]
//   build/examples/finetune_resnet --make-demo-data DIR [--digits-dir data] [--demo-classes 4]
//     [--demo-images 60]
//
// DIR holds train/ and val/, each with one folder per class (ImageNet's layout; without val/, a
// stratified --val-fraction of train/ is held out). --weights is a torchvision state_dict saved
// with safetensors (`safetensors.torch.save_file(torchvision.models.resnet50(weights=...)
// .state_dict(), FILE)`): it loads with no renaming, its 1000-class head left out; without it the
// network starts from kiln's seeded initialisation. The head is replaced by a fresh
// Linear<2048, classes> (nn::Linear<2048, dyn>::reset), and every layer before --train-from is
// frozen: no gradients, no optimizer state, its batch norms on their running statistics (never
// updated), nothing recorded for backward below it. --batch is the effective batch; --accumulate
// N splits it into N micro-batches of batch / N (what to do when a batch does not fit). AdamW at
// --lr for batch 32, scaled by sqrt(batch / 32) (optim::scale_lr's sqrt rule), with a linear
// warmup over --warmup-steps optimizer steps (5% of the run by default). Training images get
// RandomResizedCrop(224) + flip, validation images Resize(256) + CenterCrop(224), both ImageNet-
// normalised, decoded by the loader's workers.
//
// --plan prints the memory plan (kiln/train/memory_plan.hpp, within 6% of the measured peak for
// ResNet-50: bench/memory_plan) per micro-batch and per 32 images beside the usual rule of thumb,
// and the largest micro-batch for --memory-budget (or the available memory); a micro-batch that
// does not fit is refused before training, with the --accumulate that makes it fit.
//
// Each epoch prints its train loss, validation accuracy, images/s and peak memory; the run closes
// with a check that the frozen layers' parameters and batch-norm statistics are bit-identical to
// what was loaded, and `final val accuracy X`. --make-demo-data writes a small image folder (the
// digits of data/, drawn at 64x64 in colour, PNG and JPEG) to try it on. The CPU runs it; the
// device's half-precision convolutions are not written yet.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <string>
#include <vector>

#include "kiln/data/idx.hpp"
#include "kiln/data/image_folder.hpp"
#include "kiln/data/image_write.hpp"
#include "kiln/data/loader.hpp"
#include "kiln/io/crc32c.hpp"
#include "kiln/io/model_state.hpp"
#include "kiln/nn/freeze.hpp"
#include "kiln/nn/summary.hpp"
#include "kiln/optim/batch_scaling.hpp"
#include "kiln/optim/schedule.hpp"
#include "kiln/train/checkpoint.hpp"
#include "kiln/train/memory_plan.hpp"
#include "kiln/train/report.hpp"

#include "cli.hpp"
#include "finetune_resnet/steps.hpp"

namespace {

using finetune_resnet::index_t;
using finetune_resnet::Model;
namespace fs = std::filesystem;

constexpr index_t base_batch = 32;  // the batch --lr is given for

struct Options {
  std::string data_dir, weights, arch = "resnet50", train_from = "layer4", precision = "bf16_mixed", save_weights;
  std::string memory_budget, make_demo_data, digits_dir = "data";
  index_t batch = 128, accumulate = 1, warmup_steps = -1, demo_classes = 4, demo_images = 60;
  int epochs = 2, threads = 2, workers = 2;
  double lr = 3e-4, val_fraction = 0.2;
  bool plan = false;
  std::uint64_t seed = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  kiln_example::Flags flags;
  using kiln_example::non_negative;
  using kiln_example::positive;
  flags.add("--data-dir", o.data_dir).add("--weights", o.weights).add("--arch", o.arch);
  flags.add("--train-from", o.train_from).add("--precision", o.precision).add("--save-weights", o.save_weights);
  flags.add("--batch", o.batch, positive).add("--accumulate", o.accumulate, positive);
  flags.add("--epochs", o.epochs, non_negative).add("--lr", o.lr, positive).add("--warmup-steps", o.warmup_steps);
  flags.add("--plan", o.plan).add("--memory-budget", o.memory_budget);
  flags.add("--workers", o.workers, non_negative).add("--threads", o.threads, positive).add("--seed", o.seed);
  flags.add("--val-fraction", o.val_fraction, positive);
  flags.add("--make-demo-data", o.make_demo_data).add("--digits-dir", o.digits_dir);
  flags.add("--demo-classes", o.demo_classes, positive).add("--demo-images", o.demo_images, positive);
  flags.parse(argc, argv,
              "usage: finetune_resnet --data-dir DIR [--weights FILE] [--arch resnet50] [--train-from layer4] "
              "[--precision fp32|tf32|bf16_mixed] [--batch 128] [--accumulate N] [--epochs 2] [--lr 3e-4] "
              "[--warmup-steps N] [--plan] [--memory-budget 8GiB] [--workers 2] [--threads 2] [--seed 0] "
              "[--val-fraction 0.2] [--save-weights FILE]\n"
              "       finetune_resnet --make-demo-data DIR [--digits-dir data] [--demo-classes 4] [--demo-images 60]\n"
              "Fine-tunes torchvision's ResNet-50 (its weights from a safetensors state_dict, or kiln's initialisation) "
              "on DIR/train/<class>/*.jpg|png, validating on DIR/val (or a split of train), the layers before "
              "--train-from frozen; --batch is the effective batch, --accumulate the micro-batches it is split "
              "into.\n");
  KILN_CHECK(o.make_demo_data.empty() != o.data_dir.empty(), kiln::ValueError,
             "give --data-dir DIR (a folder to fine-tune on) or --make-demo-data DIR (to write one), one of them");
  KILN_CHECK(o.arch == "resnet50", kiln::ValueError, "--arch ", o.arch,
             ": this program is built for resnet50 (kiln::models::ResNet18 / 34 / 101 are the same one line "
             "away in examples/finetune_resnet/steps.hpp)");
  KILN_CHECK(o.batch % o.accumulate == 0, kiln::ValueError, "--batch ", o.batch, " is the effective batch: it must ",
             "split evenly into --accumulate ", o.accumulate, " micro-batches");
  KILN_CHECK(o.val_fraction < 1, kiln::ValueError, "--val-fraction ", o.val_fraction, " must be below 1");
  return o;
}

// "8GiB", "512MiB", "1.5GB", "300000000": bytes.
std::size_t parse_bytes(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  const double scale = unit.empty() || unit == "B" ? 1.0
                       : unit == "KiB"             ? 1024.0
                       : unit == "MiB"             ? 1048576.0
                       : unit == "GiB"             ? 1073741824.0
                       : unit == "KB"              ? 1e3
                       : unit == "MB"              ? 1e6
                       : unit == "GB"              ? 1e9
                                                   : -1.0;
  KILN_CHECK(used > 0 && value > 0 && scale > 0, kiln::ValueError, "--memory-budget ", text,
             ": expected a size such as 8GiB, 512MiB, 1.5GB or a byte count");
  return std::size_t(value * scale);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The process's peak resident memory (VmHWM), MiB; 0 when /proc cannot tell.
double peak_rss_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string key; in >> key;) {
    if (key == "VmHWM:") {
      double kib = 0;
      in >> kib;
      return kib / 1024.0;
    }
    std::getline(in, key);
  }
  return 0;
}

// --make-demo-data: the first digits of digits20 (20x20 grey), drawn at 64x64 in colour, as a
// train/ and val/ folder of --demo-classes classes (the digits 0, 1, ...), PNG and JPEG mixed.
int make_demo_data(const Options& o) {
  KILN_CHECK(o.demo_classes >= 2 && o.demo_classes <= 10, kiln::ValueError, "--demo-classes ", o.demo_classes,
             " must be 2..10 (the digits)");
  const auto digits = kiln::data::load_idx_classification(o.digits_dir + "/digits20-train-images-idx3-ubyte.gz",
                                                          o.digits_dir + "/digits20-train-labels-idx1-ubyte.gz", 10);
  std::vector<index_t> written(std::size_t(o.demo_classes), 0);
  const index_t val = std::max<index_t>(1, o.demo_images / 5);  // a fifth of each class for val/
  for (index_t i = 0; i < digits.n; ++i) {
    const auto label = digits.labels[std::size_t(i)];
    if (label >= o.demo_classes || written[std::size_t(label)] >= o.demo_images) continue;
    const index_t k = written[std::size_t(label)]++;
    kiln::data::Image small{.height = 20, .width = 20, .channels = 3, .pixels = {}};
    for (float v : digits.row(i)) {
      const auto g = std::uint8_t(std::clamp(v, 0.0f, 255.0f));
      small.pixels.insert(small.pixels.end(), {g, std::uint8_t(255 - g), std::uint8_t(g / 2)});
    }
    const kiln::data::Image image = kiln::data::resize(small, 64, 64);
    const fs::path dir = fs::path(o.make_demo_data) / (k < val ? "val" : "train") / std::to_string(label);
    fs::create_directories(dir);
    char name[32];
    std::snprintf(name, sizeof name, "%04lld.%s", (long long)k, k % 2 ? "jpg" : "png");
    kiln::data::write_image(dir / name, image, 92);
  }
  for (index_t c = 0; c < o.demo_classes; ++c)
    KILN_CHECK(written[std::size_t(c)] == o.demo_images, kiln::DataError, o.digits_dir, ": only ",
               written[std::size_t(c)], " images of digit ", c, " for --demo-images ", o.demo_images);
  std::printf("demo data: %lld classes x %lld images (%lld for val/, the rest for train/) in %s\n",
              (long long)o.demo_classes, (long long)o.demo_images, (long long)val, o.make_demo_data.c_str());
  return 0;
}

// The model's top-level named layers (conv1, bn1, layer1..layer4, fc), in order.
std::vector<std::string> layer_names() {
  std::vector<std::string> names;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    auto one = [&]<class L>(std::type_identity<L>) {
      if constexpr (kiln::nn::is_named_v<L>) names.emplace_back(kiln::nn::name_of<L>());
    };
    (one(std::type_identity<std::tuple_element_t<I, Model::layer_types>>{}), ...);
  }(std::make_index_sequence<Model::size()>{});
  return names;
}

// Freezes every layer before the named one (and returns the frozen layers' names).
std::vector<std::string> freeze_before(Model& model, const std::string& first_trained) {
  const auto names = layer_names();
  if (std::find(names.begin(), names.end(), first_trained) == names.end()) {
    std::string valid;
    for (const auto& n : names) valid += (valid.empty() ? "" : ", ") + n;
    throw kiln::ValueError("--train-from " + first_trained + ": no such layer; the layers are " + valid);
  }
  std::vector<std::string> frozen;
  bool before = true;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    auto one = [&](auto& layer) {
      using L = std::remove_cvref_t<decltype(layer)>;
      if constexpr (kiln::nn::is_named_v<L>) {
        if (std::string(kiln::nn::name_of<L>()) == first_trained) before = false;
        if (before) {
          kiln::nn::freeze(layer);
          frozen.emplace_back(kiln::nn::name_of<L>());
        }
      }
    };
    (one(model.template layer<I>()), ...);
  }(std::make_index_sequence<Model::size()>{});
  return frozen;
}

// CRC-32C of every state tensor under the frozen layers (parameters, batch-norm statistics and
// counts): the same before and after training when nothing frozen moved.
std::uint32_t frozen_checksum(const Model& model, const std::vector<std::string>& frozen, index_t& tensors) {
  std::uint32_t crc = 0;
  tensors = 0;
  for (const auto& t : kiln::io::model_state(model).tensors) {
    const bool under = std::any_of(frozen.begin(), frozen.end(),
                                   [&](const std::string& p) { return t.name.rfind(p + ".", 0) == 0; });
    if (!under) continue;
    std::vector<std::uint8_t> bytes(t.bytes);
    t.copy_to_host(bytes.data(), t.data, t.bytes);
    crc = kiln::io::crc32c(bytes.data(), bytes.size(), crc);
    ++tensors;
  }
  return crc;
}

finetune_resnet::HostStep make_step(const Options& o, Model& model, finetune_resnet::Optimizer& opt,
                                    kiln::CpuExecutor& exec) {
  kiln::train::StepOptions options{.accumulate = o.accumulate};
  if (o.precision == "fp32" || o.precision == "tf32")
    return finetune_resnet::make_step_float(o.precision, model, opt, exec, std::move(options));
  if (o.precision == "bf16_mixed") return finetune_resnet::make_step_bf16(model, opt, exec, std::move(options));
  throw kiln::ValueError("--precision " + o.precision +
                         ": this program builds fp32, tf32 and bf16_mixed (fp16_mixed is one file more, as "
                         "examples/train_digits has it)");
}

// --plan, and the check every run makes: does the micro-batch fit the budget?
template <class Policy>
bool plan_fits(const Options& o, const Model& model, const finetune_resnet::Optimizer& opt, const Policy& policy,
               bool print) {
  const auto plan = kiln::train::plan_memory<finetune_resnet::Optimizer>(model, opt.options(), o.threads, policy);
  const index_t micro = o.batch / o.accumulate;
  const bool given = !o.memory_budget.empty();
  const std::size_t budget = given ? parse_bytes(o.memory_budget) : kiln::train::host_memory_budget();
  const char* source = given ? "--memory-budget" : "available memory less 10%";
  const double per32 = double(plan.per_sample) * 32 / 1073741824.0;
  if (print) {
    std::printf("memory plan (%s, micro-batch %lld = --batch %lld / --accumulate %lld; budget: %s)\n%s",
                policy.precision, (long long)micro, (long long)o.batch, (long long)o.accumulate, source,
                plan.str(micro, budget).c_str());
    std::printf("  per 32 images     %.2f GiB of activations (%.2f GiB with everything else); the rule of thumb "
                "says ~2.1 GB per 32 images at 224x224, a GPU figure under mixed precision\n",
                per32, double(plan.bytes_for(32)) / 1073741824.0);
  }
  if (budget == 0 || plan.bytes_for(micro) <= budget) return true;
  const index_t largest = plan.largest_batch(budget);
  index_t n = o.accumulate;
  while (n <= o.batch && (o.batch % n != 0 || o.batch / n > largest)) ++n;
  std::fprintf(stderr,
               "finetune_resnet: a micro-batch of %lld images needs %.2f GiB, over the budget of %.2f GiB (%s); the "
               "largest that fits is %lld%s\n",
               (long long)micro, double(plan.bytes_for(micro)) / 1073741824.0, double(budget) / 1073741824.0, source,
               (long long)largest,
               largest > 0 && n <= o.batch
                   ? (": use --accumulate " + std::to_string(n) + " (micro-batches of " + std::to_string(o.batch / n) +
                      ")").c_str()
                   : ": not even one image fits; freeze more (--train-from) or use bf16_mixed");
  return false;
}

int run(const Options& o) {
  // The data: train/ and val/, or a stratified split of train/.
  const fs::path root(o.data_dir);
  std::optional<kiln::data::ImageFolder> train_part, val_part;
  std::string val_source = (root / "val").string();
  if (fs::is_directory(root / "val")) {
    train_part.emplace(root / "train");
    val_part.emplace(root / "val");
    KILN_CHECK(val_part->class_names() == train_part->class_names(), kiln::DataError, (root / "val").string(),
               ": its class folders differ from train/'s");
  } else {
    auto parts = kiln::data::ImageFolder(root / "train").split(o.val_fraction, o.seed);
    train_part.emplace(std::move(parts.first));
    val_part.emplace(std::move(parts.second));
    val_source = "a stratified " + std::to_string(int(o.val_fraction * 100 + 0.5)) + "% of train/ (no val/)";
  }
  const kiln::data::ImageFolder& train_folder = *train_part;
  const kiln::data::ImageFolder& val_folder = *val_part;
  const index_t classes = index_t(train_folder.num_classes());
  std::printf("data: %lld training images in %lld classes (%s), %lld validation images from %s\n",
              (long long)train_folder.size(), (long long)classes, (root / "train").string().c_str(),
              (long long)val_folder.size(), val_source.c_str());
  const auto train_set =
      kiln::data::image_folder_dataset(train_folder, kiln::data::ImageTransform::train(224), o.seed + 1);
  const auto val_set = kiln::data::image_folder_dataset(val_folder, kiln::data::ImageTransform::eval(224, 256), o.seed);

  // The model: torchvision's weights (or kiln's initialisation), a new head, frozen below --train-from.
  kiln::CpuExecutor exec(o.threads);
  Model model(o.seed);
  if (!o.weights.empty()) {
    const auto loaded = kiln::train::load_weights(o.weights, model, {.skip = {"fc."}});
    std::printf("weights: %s, %lld tensors left out (the old head, fc.)\n", o.weights.c_str(),
                (long long)loaded.skipped);
  } else {
    std::printf("weights: none given: kiln's initialisation from --seed %llu (fine-tuning a random backbone)\n",
                (unsigned long long)o.seed);
  }
  auto& head = model.layer<Model::size() - 1>();
  static_assert(kiln::nn::name_of<std::remove_cvref_t<decltype(head)>>() == "fc");
  head.reset(classes, o.seed + 7);
  const auto frozen = freeze_before(model, o.train_from);
  index_t frozen_tensors = 0;
  const std::uint32_t frozen_before = frozen_checksum(model, frozen, frozen_tensors);
  std::printf("model: ResNet-50, training from %s (frozen: %s)\n%s", o.train_from.c_str(),
              frozen.empty() ? "nothing" : [&] {
                std::string s;
                for (const auto& f : frozen) s += (s.empty() ? "" : ", ") + f;
                return s;
              }().c_str(),
              kiln::nn::summary(model, 1).c_str());

  const double lr = kiln::optim::scale_lr(kiln::optim::BatchScaling::sqrt, o.lr, base_batch, o.batch);
  finetune_resnet::Optimizer opt(model, {.lr = lr});
  auto step_ptr = make_step(o, model, opt, exec);
  auto& step = *step_ptr;
  if (o.plan) return plan_fits(o, model, opt, step.policy(), true) ? 0 : 1;
  if (!plan_fits(o, model, opt, step.policy(), false)) return 1;

  const index_t micro = o.batch / o.accumulate;
  kiln::data::Loader loader(train_set, {.batch_size = micro, .seed = o.seed, .drop_last = true, .workers = o.workers,
                                        .prefetch = std::max(2, o.workers)});
  const index_t steps_per_epoch = loader.batches_per_epoch() / o.accumulate;
  KILN_CHECK(steps_per_epoch > 0, kiln::ValueError, "--batch ", o.batch, " is more than the ", train_folder.size(),
             " training images: not one optimizer step per epoch");
  const index_t total = std::max<index_t>(1, steps_per_epoch * o.epochs);
  const index_t warmup = o.warmup_steps >= 0 ? std::min(o.warmup_steps, total) : std::max<index_t>(1, total / 20);
  step.set_schedule(kiln::optim::WarmupCosineLr(warmup, total, lr, lr));  // warmup, then constant
  std::printf("step: %s\nbatch %lld = %lld x %lld micro-batches; AdamW lr %g (sqrt scaling from batch %lld, --lr %g), "
              "warmup %lld of %lld optimizer steps; %d loader worker%s, %d thread%s\n",
              step.describe().c_str(), (long long)o.batch, (long long)o.accumulate, (long long)micro, lr,
              (long long)base_batch, o.lr, (long long)warmup, (long long)total, o.workers, o.workers == 1 ? "" : "s",
              o.threads, o.threads == 1 ? "" : "s");
  std::fflush(stdout);

  std::vector<double> rates;
  double accuracy = finetune_resnet::accuracy(model, exec, val_set);
  std::printf("epoch  0: val accuracy %.4f (chance %.4f)\n", accuracy, 1.0 / double(classes));
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    loader.start_epoch(epoch);
    double loss_sum = 0;
    index_t losses = 0;
    for (index_t k = 0; k < steps_per_epoch * o.accumulate; ++k) {
      step(*loader.next());
      for (float loss : step.take_losses(/*require_finite=*/true)) loss_sum += loss, ++losses;
    }
    const double s = seconds_since(t0);
    rates.push_back(double(steps_per_epoch * o.batch) / s);
    accuracy = finetune_resnet::accuracy(model, exec, val_set);
    std::printf("epoch %2d/%d: train loss %.4f, val accuracy %.4f, %.1f s, %.2f images/s, peak memory %.0f MiB\n",
                epoch + 1, o.epochs, loss_sum / double(std::max<index_t>(losses, 1)), accuracy, s, rates.back(),
                peak_rss_mib());
    std::fflush(stdout);
  }
  if (!o.save_weights.empty()) kiln::train::save_weights(o.save_weights, model);
  index_t after_tensors = 0;
  const bool unchanged = frozen_checksum(model, frozen, after_tensors) == frozen_before;
  std::printf("frozen: %lld tensors (parameters and batch-norm statistics of %zu layer%s) %s\n",
              (long long)frozen_tensors, frozen.size(), frozen.size() == 1 ? "" : "s",
              unchanged ? "bit-identical after training" : "CHANGED (a bug: frozen layers must not move)");
  std::sort(rates.begin(), rates.end());
  std::printf("final val accuracy %.4f; median %.2f images/s (batch %lld, %s, %d thread%s)\n", accuracy,
              rates.empty() ? 0.0 : rates[rates.size() / 2], (long long)o.batch, step.policy().precision, o.threads,
              o.threads == 1 ? "" : "s");
  return unchanged ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  if (!o.make_demo_data.empty()) return make_demo_data(o);
  return run(o);
} catch (const std::exception& e) {
  std::fprintf(stderr, "finetune_resnet: %s\n", e.what());
  return 1;
}

// bench/memory_plan — the memory planner (kiln/train/memory_plan.hpp) against the peak a ResNet-50
// training step really reaches at 224x224: full training and fine-tuning (layer4 + fc trainable,
// the rest frozen), fp32 and bf16_mixed, at each batch. The peak is every heap byte (the test
// suite's counting operator new, tests/memory/counting_new.cpp) over two AdamW steps, above what
// was in use before the model was made; the prediction is plan_memory's bytes_for(batch).
//
// Output, one JSON line per measurement: bench, model, mode, precision, batch, threads,
// predicted_bytes, measured_bytes, error (predicted / measured - 1).
//
//   build/bench/memory_plan [--batches 2,8,16] [--modes train,finetune] [--precisions fp32,bf16_mixed]
//                           [--threads 2]
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#define KILN_FORCE_EAGER_FORMS 0  // one stance: the ops' force_eager forms are not compiled
#include "counting_new.hpp"
#include "kiln/models/resnet.hpp"
#include "kiln/train.hpp"
#include "kiln/train/memory_plan.hpp"

namespace {

using kiln::index_t;
using Model = kiln::models::ResNet50<10, 224>;

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

// Freezes everything below layer4 (the stem and layer1..3): fine-tuning's trainable part is
// layer4 and fc.
void freeze_below_layer4(Model& model) {
  kiln::nn::freeze(model.layer<1>());  // conv1
  kiln::nn::freeze(model.layer<2>());  // bn1
  kiln::nn::freeze(model.layer<5>());  // layer1
  kiln::nn::freeze(model.layer<6>());  // layer2
  kiln::nn::freeze(model.layer<7>());  // layer3
}

template <class Policy>
void measure(index_t batch, bool finetune, int threads) {
  const index_t dim = Model::in_features;
  std::vector<float> x(static_cast<std::size_t>(batch * dim));
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch), 0);
  kiln::Generator gen(1);
  for (auto& v : x) v = gen.uniform(-1.f, 1.f);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 10);
  const std::size_t before = kiln_memory_test::heap_in_use();
  kiln_memory_test::reset_heap_peak();
  std::size_t predicted = 0;
  {
    kiln::CpuExecutor exec(threads);
    Model model(0);
    if (finetune) freeze_below_layer4(model);
    kiln::optim::AdamW opt(model, {.lr = 3e-4});
    predicted = kiln::train::plan_memory<kiln::optim::AdamW<>, Policy>(model, opt.options(), threads).bytes_for(batch);
    kiln::train::Step step(model, opt, exec, Policy{});
    for (int s = 0; s < 2; ++s) step.run(x.data(), y.data(), batch, dim);
  }
  const std::size_t measured = kiln_memory_test::heap_peak() - before;
  std::printf("{\"bench\":\"memory_plan\",\"model\":\"resnet50_224\",\"mode\":\"%s\",\"precision\":\"%s\",\"batch\":%lld,"
              "\"threads\":%d,\"predicted_bytes\":%zu,\"measured_bytes\":%zu,\"error\":%.4f}\n",
              finetune ? "finetune" : "train", Policy::precision::name, (long long)batch, threads, predicted, measured,
              double(predicted) / double(measured) - 1.0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  kiln::set_host_cache_limit(0);  // the heap's peak as the plan models it: live blocks, none kept for reuse
  std::string batches = "2,8,16", modes = "train,finetune", precisions = "fp32,bf16_mixed";
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--batches") batches = argv[i + 1];
    else if (flag == "--modes") modes = argv[i + 1];
    else if (flag == "--precisions") precisions = argv[i + 1];
    else if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "memory_plan: unknown option %s (--batches, --modes, --precisions, --threads)\n", flag.c_str());
      return 2;
    }
  }
  try {
    for (const auto& p : split(precisions))
      for (const auto& m : split(modes))
        for (const auto& b : split(batches)) {
          const index_t batch = std::atol(b.c_str());
          const bool finetune = m == "finetune";
          if (p == "fp32") measure<kiln::policy<>>(batch, finetune, threads);
          else if (p == "bf16_mixed") measure<kiln::policy<kiln::precision::bf16_mixed>>(batch, finetune, threads);
          else throw kiln::ValueError("memory_plan: --precisions takes fp32 and bf16_mixed, not " + p);
        }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memory_plan: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Checkpoints on CUDA: a model, AdamW state and loss scaler saved from device memory load into a
// host model with the same bytes (tensors are saved from either space, loaded into the model's),
// and a run resumed on the device from a mid-epoch checkpoint ends bit for bit where the
// uninterrupted device run ends (same machine, same backend).
#include <doctest/doctest.h>

#include <kiln/train.cuh>
#include <kiln/train/checkpoint.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using kiln::index_t;
namespace nn = kiln::nn;
namespace fs = std::filesystem;
using Mlp = nn::Sequential<nn::Linear<12, 32>, nn::ReLU, nn::Dropout<0.1>, nn::Linear<32, 4>>;

kiln::data::Dataset dataset(index_t n) {
  kiln::Generator g(9);
  kiln::data::Dataset d;
  d.n = n;
  d.d = 12;
  d.num_classes = 4;
  for (index_t i = 0; i < n * 12; ++i) d.features.push_back(g.uniform(-1.f, 1.f));
  for (index_t i = 0; i < n; ++i) d.labels.push_back(std::int32_t(g.below(4)));
  return d;
}

// The model's state as host bytes, whatever its space.
template <class Model>
std::vector<std::uint8_t> state_bytes(const Model& m) {
  std::vector<std::uint8_t> out;
  kiln::io::for_each_state(m, [&](const std::string&, auto& item, kiln::io::state_kind) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(item)>, std::int64_t>) {
      const auto* p = reinterpret_cast<const std::uint8_t*>(&item);
      out.insert(out.end(), p, p + sizeof item);
    } else {
      const auto b = kiln::train::detail::host_bytes(kiln::train::detail::tensor_of_item(item));
      out.insert(out.end(), b.begin(), b.end());
    }
  });
  return out;
}

// Trains 3 epochs with the loss scaler on the device; with stop_after > 0 saves after that many steps
// and continues in new objects loaded from the file.
std::vector<std::uint8_t> run(index_t stop_after, const std::string& path) {
  using Policy = kiln::policy<kiln::loss_scaling::dynamic>;  // the scaler state travels too
  using Model = Mlp::on<kiln::cuda>;
  const auto ds = dataset(100);
  auto exec = kiln::make_executor<kiln::cuda>(1);
  auto model = std::make_unique<Model>(1);
  auto opt = std::make_unique<kiln::optim::AdamW<kiln::cuda>>(*model, kiln::optim::AdamWOptions{.lr = 3e-3});
  using StepT = kiln::train::Step<Model, kiln::optim::AdamW<kiln::cuda>, decltype(exec), Policy>;
  auto step = std::make_unique<StepT>(*model, *opt, exec);
  kiln::data::BatchLoader<kiln::cuda> loader(ds, {.batch_size = 8, .seed = 2}, exec);
  index_t epoch = 0, first = 0;
  if (stop_after > 0) {
    for (bool stopped = false; epoch < 3 && !stopped; ++epoch) {
      loader.start_epoch(epoch);
      while (const auto* b = loader.next()) {
        (*step)(*b);
        if (step->micro_batches() == stop_after) {
          kiln::train::save_checkpoint(path, *step, {epoch, loader.batches_taken()});
          stopped = true;
          break;
        }
      }
    }
    model = std::make_unique<Model>(7);
    opt = std::make_unique<kiln::optim::AdamW<kiln::cuda>>(*model, kiln::optim::AdamWOptions{.lr = 3e-3});
    step = std::make_unique<StepT>(*model, *opt, exec);
    const auto info = kiln::train::load_checkpoint(path, *step);
    epoch = info.position.epoch;
    first = info.position.batch;
  }
  for (; epoch < 3; ++epoch) {
    loader.start_epoch(epoch, first);
    first = 0;
    while (const auto* b = loader.next()) (*step)(*b);
  }
  auto out = state_bytes(*model);
  for (const auto& buf : opt->state_buffers()) {
    std::vector<std::uint8_t> b(std::size_t(opt->table().total_size()) * sizeof(float));
    kiln::memory_traits<kiln::cuda>::copy_to_host(b.data(), buf.data, b.size());
    out.insert(out.end(), b.begin(), b.end());
  }
  const float scale = step->scaler().scale();
  const auto* s = reinterpret_cast<const std::uint8_t*>(&scale);
  out.insert(out.end(), s, s + sizeof scale);
  return out;
}

}  // namespace

TEST_CASE("checkpoint on CUDA: device weights load into a host model with the same bytes") {
  const fs::path dir = fs::temp_directory_path() / ("kiln_cuda_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Mlp::on<kiln::cuda> device_model(3);
  Mlp host_model(4);
  const std::string path = (dir / "w.safetensors").string();
  kiln::train::save_weights(path, device_model);
  kiln::train::load_weights(path, host_model);
  CHECK(state_bytes(host_model) == state_bytes(device_model));
  Mlp::on<kiln::cuda> back(5);
  kiln::train::load_weights(path, back);
  CHECK(state_bytes(back) == state_bytes(device_model));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint on CUDA: dropout and the loss scaler resumed mid-epoch ends bit for bit where the whole run does") {
  const fs::path dir = fs::temp_directory_path() / ("kiln_cuda_resume_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "mid.safetensors").string();
  const auto whole = run(0, path);
  CHECK(run(17, path) == whole);
  fs::remove_all(dir);
}

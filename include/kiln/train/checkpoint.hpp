// kiln/train/checkpoint.hpp — saving and restoring training, in the safetensors format.
//
// Weights: save_weights / load_weights write and read a model's tensors under PyTorch's
// state_dict names (kiln/io/state_dict.hpp): `safetensors.torch.load_file` + `load_state_dict`
// loads them into the equivalent torch.nn.Sequential, and a state dict PyTorch saved with
// `safetensors.torch.save_file` loads into the kiln model.
//
// Checkpoints: save_checkpoint / load_checkpoint hold everything a run needs to continue
// bitwise-identically on the same machine and backend — the model's parameters and buffers, the
// optimizer's state per parameter ("optimizer.exp_avg.0.weight", "optimizer.step.0.weight", ...),
// and in the metadata the optimizer's step counts and learning rate, the loss scaler's state, the
// dropout layers' random stream positions, the step's micro-batch and optimizer-step counts (the
// learning-rate schedule's position) and the loader's position (epoch, next batch). A
// checkpoint's model tensors keep their plain names, so PyTorch reads its weights by dropping the
// "optimizer." entries. Taken between optimizer steps (gradients are none then, and need no saving).
//
// Loading stages: the whole file is read and checked (checksum, names, dtypes, shapes, every
// number in the metadata) before anything in the model, optimizer or step changes, so a bad file
// is a DataError naming the file and what is wrong and leaves training as it was.
//
//   kiln::train::save_checkpoint("run/step-1000.safetensors", step, {.epoch = e, .batch = b});
//   auto info = kiln::train::load_checkpoint("run/step-1000.safetensors", step);
//   loader.start_epoch(info.position.epoch, info.position.batch);
// Keeping the last K of them in a directory, and resuming from the newest valid one:
// kiln/train/checkpoint_dir.hpp.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "kiln/autograd/var.hpp"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/io/model_state.hpp"
#include "kiln/io/safetensors.hpp"
#include "kiln/io/state_dict.hpp"
#include "kiln/optim/param.hpp"
#include "kiln/train/grad_scaler.hpp"

namespace kiln::train {

// Where the loader is: the epoch, and the first batch of it not yet trained on.
struct TrainPosition {
  index_t epoch = 0;
  index_t batch = 0;
};

struct CheckpointInfo {
  std::string path;
  TrainPosition position;
  index_t optimizer_steps = 0;
  index_t micro_batches = 0;
  std::map<std::string, std::string> metadata;  // everything the file's metadata holds
};

// The checkpoint format's name in the metadata ("kiln.format").
inline constexpr const char* checkpoint_format = "kiln.checkpoint.1";
// Tensor names under this prefix are training state, not the model's.
inline constexpr const char* optimizer_prefix = "optimizer.";

// How load_weights matches a file's tensors to the model's (PyTorch's load_state_dict options).
//   train::load_weights("resnet50.safetensors", model,
//                       {.strict = true, .skip = {"fc."}});   // torchvision's weights, a new head
struct LoadOptions {
  // Every model tensor must be in the file and the file may hold no others (PyTorch's
  // strict=True). Not strict: what is absent keeps its values and what is extra is ignored; both
  // are returned (LoadResult). Entries under "optimizer." (a kiln checkpoint's training state)
  // are always allowed. A shape or dtype that differs is an error either way, as in PyTorch.
  bool strict = true;
  // Name prefixes left out on both sides: the model's tensors under them keep their values, the
  // file's are ignored ({"fc."}: a new head for another class count).
  std::vector<std::string> skip{};
  // Maps a file name to the model's name for it (applied before `skip`); "" drops the tensor.
  // E.g. [](const std::string& n) { return n.rfind("module.", 0) == 0 ? n.substr(7) : n; }.
  std::function<std::string(const std::string&)> rename{};
};

// What a load left out (empty after a strict load): model tensors the file does not hold, and
// file tensors the model does not have (under their renamed names), as PyTorch's load_state_dict
// returns them; `skipped` counts the tensors `skip` left out on both sides.
struct LoadResult {
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  index_t skipped = 0;
};

namespace detail {

template <class Item>
auto& tensor_of_item(Item& item) {
  if constexpr (ag::is_var_v<std::remove_cvref_t<Item>>) return item.value();
  else return item;
}

KILN_COMPILED std::vector<std::int64_t> dims_of(const Shape& s);

// A tensor's values copied to the host, as bytes.
template <class Tensor>
std::vector<std::uint8_t> host_bytes(const Tensor& t) {
  using T = typename std::remove_cvref_t<Tensor>::value_type;
  using S = typename std::remove_cvref_t<Tensor>::space;
  std::vector<std::uint8_t> out(std::size_t(t.size()) * sizeof(T));
  memory_traits<S>::copy_to_host(out.data(), t.data(), out.size());
  return out;
}

// The model's state into a writer, under `prefix`-less state_dict names.
KILN_COMPILED void add_model_state(io::SafetensorsWriter& w, const io::ModelState& state);
template <class Model>
void add_model_state(io::SafetensorsWriter& w, const Model& model) {
  add_model_state(w, io::model_state(model));
}

// A loaded value waiting to be applied (everything is checked before the first one runs).
using Apply = std::function<void()>;

// Checks every model tensor against the file and queues its copy (see LoadOptions); a mismatch
// is one DataError naming the first few of each kind and their counts.
KILN_COMPILED LoadResult stage_model_state(const io::SafetensorsFile& file, const io::ModelState& state,
                                           const LoadOptions& options, std::vector<Apply>& apply);

// The name of each optimizer slot: the state_dict name of the parameter whose values it updates.
KILN_COMPILED std::vector<std::string> slot_names(const io::ModelState& state, const optim::ParamTable& table);
// The shape of the model's tensor `name` (a parameter's: its optimizer slots have it).
KILN_COMPILED std::vector<std::int64_t> shape_of(const io::ModelState& state, const std::string& name);

template <class O>
const char* optimizer_name() {
  if constexpr (requires { O::name; }) return O::name;
  else return "optimizer";
}

KILN_COMPILED std::string number_text(double v);

// Metadata lookups for a checkpoint, each failing with the file and the key.
struct MetaReader {
  const io::SafetensorsFile& file;
  KILN_COMPILED const std::string& text(const std::string& key) const;
  KILN_COMPILED std::int64_t integer(const std::string& key) const;
  KILN_COMPILED std::uint64_t u64(const std::string& key) const;
  KILN_COMPILED double real(const std::string& key) const;
};

}  // namespace detail

// CRC-32C of the model's state (every tensor of for_each_state, in order, as bytes): two runs
// that end with the same value ended in the same state, bit for bit.
KILN_COMPILED std::uint32_t state_checksum(const io::ModelState& state);
template <class Model>
std::uint32_t state_checksum(const Model& model) {
  return state_checksum(io::model_state(model));
}

// ---- weights ---------------------------------------------------------------------------------

// Writes the model's parameters and buffers under PyTorch's state_dict names (atomic).
// throws: DataError naming the file when it cannot be written (an existing file stays intact).
template <class Model>
void save_weights(const std::string& path, const Model& model) {
  io::SafetensorsWriter w;
  w.set_metadata("format", "pt");  // what safetensors.torch writes; some readers look for it
  detail::add_model_state(w, model);
  w.write(path);
}

// Loads weights saved by save_weights, save_checkpoint or PyTorch (safetensors.torch.save_file of
// the equivalent module's state_dict()) into the model's memory space; returns what a non-strict
// load left out.
// throws: DataError naming the file and what differs — the first few missing names, extra names
//   and shapes or dtypes that differ, with each kind's count; the model is then unchanged.
template <class Model>
LoadResult load_weights(const std::string& path, Model& model, const LoadOptions& options = {}) {
  const auto file = io::SafetensorsFile::open(path);
  std::vector<detail::Apply> apply;
  LoadResult result = detail::stage_model_state(file, io::model_state(model), options, apply);
  for (auto& a : apply) a();
  if constexpr (requires { model.zero_grad(); }) model.zero_grad();
  return result;
}

// ---- whole training state --------------------------------------------------------------------

namespace detail {

// A step as its checkpoint sees it, untyped: write_checkpoint and read_checkpoint take it, so a
// checkpoint's writing and reading are compiled once (checkpoint_bodies.hpp) and save_checkpoint
// and load_checkpoint below only fill it in.
struct CheckpointedStep {
  io::ModelState model;
  const optim::ParamTable* table = nullptr;
  std::vector<optim::StateBuffer> buffers;  // the optimizer's, in the model's memory space
  const char* optimizer = "optimizer";      // optimizer_name<O>()
  const char* counter_name = "step";        // O::counter_name
  void (*copy_to_host)(void* dst, const void* src, std::size_t bytes) = nullptr;
  void (*copy_from_host)(void* dst, const void* src, std::size_t bytes) = nullptr;
  index_t accumulation = 1;
  bool scaler_enabled = false;
};

// The step's values a checkpoint holds besides its tensors.
struct CheckpointValues {
  std::vector<index_t> counters;  // the optimizer's per-parameter step counters
  index_t optimizer_counter = 0;  // the optimizer's own step count
  double lr = 0;
  const char* precision = "fp32";
  index_t micro_batches = 0, optimizer_steps = 0;
  ScalerState scaler{};
};

template <class StepT>
CheckpointedStep checkpointed(StepT& step) {
  auto& opt = step.optimizer();
  using Optimizer = std::remove_cvref_t<decltype(opt)>;
  using space = typename std::remove_cvref_t<decltype(step.model())>::space;
  return {.model = io::model_state(step.model()),
          .table = &opt.table(),
          .buffers = opt.state_buffers(),
          .optimizer = optimizer_name<Optimizer>(),
          .counter_name = Optimizer::counter_name,
          .copy_to_host = &memory_traits<space>::copy_to_host,
          .copy_from_host = &memory_traits<space>::copy_from_host,
          .accumulation = step.accumulation(),
          .scaler_enabled = step.scaler().enabled()};
}

// The file at `path` (atomically replaced) holding the step's tensors, its values, the loader's
// position and the caller's metadata.
KILN_COMPILED void write_checkpoint(const std::string& path, const CheckpointedStep& step,
                                    const CheckpointValues& values, TrainPosition position,
                                    const std::map<std::string, std::string>& extra);

// A checkpoint read and checked against the step, not yet applied: `apply` copies the model's and
// the optimizer's tensors in (from the file's bytes, which `file` keeps) and sets the random
// generators; `values` are the step's.
struct ReadCheckpoint {
  std::shared_ptr<const io::SafetensorsFile> file;
  CheckpointInfo info;
  std::vector<Apply> apply;
  CheckpointValues values;
};
KILN_COMPILED ReadCheckpoint read_checkpoint(const std::string& path, const CheckpointedStep& step);

}  // namespace detail

// Writes a checkpoint of a train::Step (its model, optimizer, loss scaler and counts) and the
// loader's position; `extra` adds metadata of the caller's (keys must not start with "kiln.").
// throws: ValueError when the step is inside an accumulation (take it after an optimizer step);
//   DataError when the file cannot be written (the previous file stays intact).
template <class StepT>
void save_checkpoint(const std::string& path, StepT& step, TrainPosition position,
                     const std::map<std::string, std::string>& extra = {}) {
  const auto& opt = step.optimizer();
  detail::write_checkpoint(path, detail::checkpointed(step),
                           {.counters = opt.param_counters(),
                            .optimizer_counter = opt.steps(),
                            .lr = opt.lr(),
                            .precision = step.policy().precision,
                            .micro_batches = step.micro_batches(),
                            .optimizer_steps = step.optimizer_steps(),
                            .scaler = step.scaler().state()},
                           position, extra);
}

// Restores a checkpoint written by save_checkpoint into a step built like the saved one (same
// model type, optimizer kind and accumulation); returns where the loader should continue.
// throws: DataError naming the file and what is wrong (not a kiln checkpoint, corrupted, another
//   model, another optimizer); nothing is changed then.
template <class StepT>
CheckpointInfo load_checkpoint(const std::string& path, StepT& step) {
  detail::ReadCheckpoint read = detail::read_checkpoint(path, detail::checkpointed(step));
  // Everything checked: apply.
  for (auto& a : read.apply) a();
  auto& opt = step.optimizer();
  opt.set_param_counters(read.values.counters);
  opt.set_steps(read.values.optimizer_counter);
  opt.set_lr(read.values.lr);
  if (step.scaler().enabled()) step.scaler().load_state(read.values.scaler);
  step.resume_at(read.info.micro_batches, read.info.optimizer_steps);
  return std::move(read.info);
}

}  // namespace kiln::train

#if KILN_HEADER_BODIES
#include "kiln/train/checkpoint_bodies.hpp"
#endif

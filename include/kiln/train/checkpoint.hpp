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

// Checks every model tensor against the file and queues its copy. strict: the file may hold no
// other tensors than the model's (and, for a checkpoint, the optimizer's).
KILN_COMPILED void stage_model_state(const io::SafetensorsFile& file, const io::ModelState& state, bool strict,
                                     std::vector<Apply>& apply);
template <class Model>
void stage_model_state(const io::SafetensorsFile& file, Model& model, bool strict, std::vector<Apply>& apply) {
  stage_model_state(file, io::model_state(model), strict, apply);
}

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

struct LoadOptions {
  // Refuse a file that holds tensors the model does not have (PyTorch's strict=True). Entries
  // under "optimizer." (a kiln checkpoint's training state) are always allowed.
  bool strict = true;
};

// Loads weights saved by save_weights, save_checkpoint or PyTorch (safetensors.torch.save_file of
// the equivalent module's state_dict()) into the model's memory space.
// throws: DataError naming the file and what differs (a missing or extra name, expected vs found
//   shape or dtype); the model is then unchanged.
template <class Model>
void load_weights(const std::string& path, Model& model, LoadOptions options = {}) {
  const auto file = io::SafetensorsFile::open(path);
  std::vector<detail::Apply> apply;
  detail::stage_model_state(file, model, options.strict, apply);
  for (auto& a : apply) a();
  if constexpr (requires { model.zero_grad(); }) model.zero_grad();
}

// ---- whole training state --------------------------------------------------------------------

// Writes a checkpoint of a train::Step (its model, optimizer, loss scaler and counts) and the
// loader's position; `extra` adds metadata of the caller's (keys must not start with "kiln.").
// throws: ValueError when the step is inside an accumulation (take it after an optimizer step);
//   DataError when the file cannot be written (the previous file stays intact).
template <class StepT>
void save_checkpoint(const std::string& path, StepT& step, TrainPosition position,
                     const std::map<std::string, std::string>& extra = {}) {
  KILN_CHECK(step.at_step_boundary(), ValueError, "save_checkpoint: the step is inside an accumulation (",
             step.micro_batches() % step.accumulation(), " of ", step.accumulation(),
             " micro-batches); save right after an optimizer step");
  auto& model = step.model();
  auto& opt = step.optimizer();
  using Optimizer = std::remove_cvref_t<decltype(opt)>;
  using space = typename std::remove_cvref_t<decltype(model)>::space;
  io::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.set_metadata("kiln.format", checkpoint_format);
  const io::ModelState state = io::model_state(model);
  detail::add_model_state(w, state);

  const auto& table = opt.table();
  const auto names = detail::slot_names(state, table);
  std::vector<std::vector<std::int64_t>> shapes;  // each slot's: its parameter's
  for (const auto& name : names) shapes.push_back(detail::shape_of(state, name));
  for (const auto& buf : opt.state_buffers()) {
    for (index_t k = 0; k < table.count(); ++k) {
      std::vector<std::uint8_t> bytes(std::size_t(table[k].size) * sizeof(float));
      memory_traits<space>::copy_to_host(bytes.data(), buf.data + table.offset(k), bytes.size());
      w.add(std::string(optimizer_prefix) + buf.name + "." + names[std::size_t(k)], dtype::f32,
            shapes[std::size_t(k)], bytes);
    }
  }
  const auto counters = opt.param_counters();
  for (index_t k = 0; k < table.count(); ++k) {
    const std::int64_t v = counters[std::size_t(k)];
    w.add_values<std::int64_t>(std::string(optimizer_prefix) + Optimizer::counter_name + "." + names[std::size_t(k)], {},
                               {&v, 1});
  }
  auto meta = [&](const std::string& key, const std::string& value) { w.set_metadata("kiln." + key, value); };
  meta("optimizer", detail::optimizer_name<Optimizer>());
  meta("optimizer.steps", std::to_string(opt.steps()));
  meta("optimizer.lr", detail::number_text(opt.lr()));
  meta("precision", step.policy().precision);
  meta("accumulate", std::to_string(step.accumulation()));
  meta("micro_batches", std::to_string(step.micro_batches()));
  meta("optimizer_steps", std::to_string(step.optimizer_steps()));
  meta("epoch", std::to_string(position.epoch));
  meta("batch", std::to_string(position.batch));
  const auto s = step.scaler().state();
  meta("scaler.enabled", step.scaler().enabled() ? "1" : "0");
  meta("scaler.scale", detail::number_text(s.scale));
  meta("scaler.growth_tracker", std::to_string(s.growth_tracker));
  meta("scaler.steps", std::to_string(s.steps));
  meta("scaler.skipped", std::to_string(s.skipped));
  meta("scaler.floor_step", std::to_string(s.floor_step));
  for (const auto& rng : state.rngs) {
    const auto [seed, offset] = rng.get();
    meta("rng." + rng.prefix + "seed", std::to_string(seed));
    meta("rng." + rng.prefix + "offset", std::to_string(offset));
  }
  for (const auto& [k, v] : extra) {
    KILN_CHECK(k.rfind("kiln.", 0) != 0, ValueError, "save_checkpoint: extra metadata key \"", k,
               "\" uses the reserved prefix \"kiln.\"");
    w.set_metadata(k, v);
  }
  w.write(path);
}

// Restores a checkpoint written by save_checkpoint into a step built like the saved one (same
// model type, optimizer kind and accumulation); returns where the loader should continue.
// throws: DataError naming the file and what is wrong (not a kiln checkpoint, corrupted, another
//   model, another optimizer); nothing is changed then.
template <class StepT>
CheckpointInfo load_checkpoint(const std::string& path, StepT& step) {
  const auto file = io::SafetensorsFile::open(path);
  if (!file.has_checksum()) file.fail("has no kiln checksum (", io::checksum_key, "): not a kiln checkpoint");
  const detail::MetaReader meta{file};
  if (meta.text("kiln.format") != checkpoint_format)
    file.fail("kiln.format is \"", meta.text("kiln.format"), "\", this kiln reads \"", checkpoint_format, "\"");
  auto& model = step.model();
  auto& opt = step.optimizer();
  using Optimizer = std::remove_cvref_t<decltype(opt)>;
  using space = typename std::remove_cvref_t<decltype(model)>::space;
  if (meta.text("kiln.optimizer") != detail::optimizer_name<Optimizer>())
    file.fail("was written with optimizer ", meta.text("kiln.optimizer"), ", this run uses ",
              detail::optimizer_name<Optimizer>());

  std::vector<detail::Apply> apply;
  const io::ModelState state = io::model_state(model);
  detail::stage_model_state(file, state, /*strict=*/true, apply);

  const auto& table = opt.table();
  const auto names = detail::slot_names(state, table);
  std::vector<std::string> expected;  // every optimizer tensor this optimizer has
  for (const auto& buf : opt.state_buffers()) {
    for (index_t k = 0; k < table.count(); ++k) {
      const std::string name = std::string(optimizer_prefix) + buf.name + "." + names[std::size_t(k)];
      expected.push_back(name);
      const io::TensorInfo& t = file.info(name);
      if (t.dtype != "F32") file.fail("tensor \"", name, "\": expected dtype F32, found ", t.dtype);
      if (t.elements() != std::size_t(table[k].size))
        file.fail("tensor \"", name, "\": expected ", table[k].size, " values (the parameter's), found ",
                  io::shape_text(t.shape));
      const auto bytes = file.bytes(t);
      float* dst = buf.data + table.offset(k);
      apply.push_back([dst, bytes] { memory_traits<space>::copy_from_host(dst, bytes.data(), bytes.size()); });
    }
  }
  std::vector<index_t> counters;
  for (index_t k = 0; k < table.count(); ++k) {
    const std::string name = std::string(optimizer_prefix) + Optimizer::counter_name + "." + names[std::size_t(k)];
    expected.push_back(name);
    std::int64_t v = 0;
    file.read(name, dtype::i64, {}, &v);
    if (v < 0) file.fail("tensor \"", name, "\" = ", v, " is negative");
    counters.push_back(index_t(v));
  }
  for (const auto& t : file.tensors())
    if (t.name.rfind(optimizer_prefix, 0) == 0 &&
        std::find(expected.begin(), expected.end(), t.name) == expected.end())
      file.fail("holds optimizer state \"", t.name, "\" that this ", detail::optimizer_name<Optimizer>(),
                " does not have (other options, e.g. amsgrad or momentum, or frozen parameters?)");

  const std::int64_t opt_steps = meta.integer("kiln.optimizer.steps");
  const double lr = meta.real("kiln.optimizer.lr");
  CheckpointInfo info;
  info.path = path;
  info.micro_batches = index_t(meta.integer("kiln.micro_batches"));
  info.optimizer_steps = index_t(meta.integer("kiln.optimizer_steps"));
  info.position = {index_t(meta.integer("kiln.epoch")), index_t(meta.integer("kiln.batch"))};
  if (info.position.epoch < 0 || info.position.batch < 0)
    file.fail("the loader position (epoch ", info.position.epoch, ", batch ", info.position.batch, ") is negative");
  const std::int64_t accumulate = meta.integer("kiln.accumulate");
  if (accumulate != step.accumulation())
    file.fail("was written with ", accumulate, " micro-batches per optimizer step, this run uses ",
              step.accumulation());
  const bool scaler_on = meta.integer("kiln.scaler.enabled") != 0;
  if (scaler_on != step.scaler().enabled())
    file.fail("was written with loss scaling ", scaler_on ? "on" : "off", ", this run has it ",
              step.scaler().enabled() ? "on" : "off", " (another --precision?)");
  detail::ScalerState scaler{};
  scaler.scale = float(meta.real("kiln.scaler.scale"));
  scaler.growth_tracker = index_t(meta.integer("kiln.scaler.growth_tracker"));
  scaler.steps = index_t(meta.integer("kiln.scaler.steps"));
  scaler.skipped = index_t(meta.integer("kiln.scaler.skipped"));
  scaler.floor_step = index_t(meta.integer("kiln.scaler.floor_step"));
  for (const auto& rng : state.rngs) {
    const std::uint64_t seed = meta.u64("kiln.rng." + rng.prefix + "seed");
    const std::uint64_t offset = meta.u64("kiln.rng." + rng.prefix + "offset");
    apply.push_back([set = rng.set, seed, offset] { set(seed, offset); });
  }
  if (info.micro_batches != info.optimizer_steps * step.accumulation())
    file.fail(info.micro_batches, " micro-batches are not ", info.optimizer_steps, " optimizer steps of ",
              step.accumulation());
  info.metadata = file.metadata();

  // Everything checked: apply.
  for (auto& a : apply) a();
  opt.set_param_counters(counters);
  opt.set_steps(index_t(opt_steps));
  opt.set_lr(lr);
  if (scaler_on) step.scaler().load_state(scaler);
  step.resume_at(info.micro_batches, info.optimizer_steps);
  return info;
}

}  // namespace kiln::train

#if KILN_HEADER_BODIES
#include "kiln/train/checkpoint_bodies.hpp"
#endif

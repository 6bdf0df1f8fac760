// kiln/train/checkpoint_bodies.hpp — the bodies of checkpoint.hpp's non-template helpers: included
// by it when kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED,
// kiln/config.hpp).
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/io/crc32c.hpp"
#include "kiln/train/checkpoint.hpp"

namespace kiln::train::detail {

KILN_COMPILED std::vector<std::int64_t> dims_of(const Shape& s) {
  std::vector<std::int64_t> out;
  for (int i = 0; i < s.rank; ++i) out.push_back(std::int64_t(s[i]));
  return out;
}

KILN_COMPILED void add_model_state(io::SafetensorsWriter& w, const io::ModelState& state) {
  for (const auto& t : state.tensors) {
    std::vector<std::uint8_t> bytes(t.bytes);
    t.copy_to_host(bytes.data(), t.data, t.bytes);
    w.add(t.name, t.type, dims_of(t.shape), bytes);
  }
}

namespace {
// "a, b, c and 7 more": the first few of a list, never a wall of names.
std::string first_few(const std::vector<std::string>& names, std::size_t shown = 5) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < shown; ++i) out.append(i == 0 ? "" : ", ").append(names[i]);
  if (names.size() > shown) out.append(" and ").append(std::to_string(names.size() - shown)).append(" more");
  return out;
}
bool under_any(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes)
    if (name.rfind(p, 0) == 0) return true;
  return false;
}
}  // namespace

KILN_COMPILED LoadResult stage_model_state(const io::SafetensorsFile& file, const io::ModelState& state,
                                           const LoadOptions& options, std::vector<Apply>& apply) {
  LoadResult result;
  // The file's tensors under the model's names (rename, then skip).
  std::map<std::string, const io::TensorInfo*> by_name;
  for (const auto& t : file.tensors()) {
    if (t.name.rfind(optimizer_prefix, 0) == 0) continue;  // a checkpoint's training state
    const std::string name = options.rename ? options.rename(t.name) : t.name;
    if (name.empty()) continue;
    if (under_any(name, options.skip)) {
      ++result.skipped;
      continue;
    }
    if (!by_name.emplace(name, &t).second)
      file.fail("two tensors are renamed to \"", name, "\" (the second is \"", t.name, "\")");
  }
  std::map<std::string, bool> used;
  std::vector<std::string> differ;  // "name (model [..] F32, file [..] F16)"
  for (const auto& t : state.tensors) {
    if (under_any(t.name, options.skip)) {
      ++result.skipped;
      continue;
    }
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      result.missing.push_back(t.name);
      continue;
    }
    used[t.name] = true;
    const io::TensorInfo& info = *it->second;
    const auto dims = dims_of(t.shape);
    const std::string want = io::safetensors_name(t.type);
    if (info.dtype != want || info.shape != dims) {
      differ.push_back(t.name + " (model " + io::shape_text(dims) + " " + want + ", file " + io::shape_text(info.shape) +
                       " " + info.dtype + ")");
      continue;
    }
    const auto bytes = file.bytes(info);
    apply.push_back([dst = t.data, copy = t.copy_from_host, bytes] { copy(dst, bytes.data(), bytes.size()); });
  }
  for (const auto& [name, info] : by_name)
    if (!used.count(name)) result.unexpected.push_back(name);
  const bool refuse = !differ.empty() || (options.strict && (!result.missing.empty() || !result.unexpected.empty()));
  if (refuse) {
    apply.clear();
    std::string what;
    auto add = [&](const char* label, const std::vector<std::string>& names) {
      if (names.empty()) return;
      what.append(what.empty() ? "" : "; ").append(std::to_string(names.size())).append(" ").append(label);
      what.append(": ").append(first_few(names));
    };
    add("with another shape or dtype", differ);
    if (options.strict) {
      add("of the model's tensors not in the file", result.missing);
      add("of the file's tensors not in the model", result.unexpected);
    }
    file.fail("does not match the model (", state.tensors.size(), " tensors, the file ", file.tensors().size(),
              "): ", what,
              "; weights of another architecture? (a new head: LoadOptions::skip; other names: LoadOptions::rename; "
              "strict = false loads what matches)");
  }
  return result;
}

KILN_COMPILED std::vector<std::string> slot_names(const io::ModelState& state, const optim::ParamTable& table) {
  std::map<const void*, std::string> by_pointer;
  for (const auto& t : state.tensors)
    if (t.kind == io::state_kind::parameter) by_pointer[t.data] = t.name;
  std::vector<std::string> out;
  for (index_t k = 0; k < table.count(); ++k) {
    auto it = by_pointer.find(table[k].value);
    KILN_CHECK(it != by_pointer.end(), ValueError, "checkpoint: optimizer parameter ", k,
               " is not a parameter of the model (an optimizer over several models needs one checkpoint per model)");
    out.push_back(it->second);
  }
  return out;
}

KILN_COMPILED std::vector<std::int64_t> shape_of(const io::ModelState& state, const std::string& name) {
  for (const auto& t : state.tensors)
    if (t.name == name) return dims_of(t.shape);
  return {};
}

KILN_COMPILED std::string number_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

KILN_COMPILED const std::string& MetaReader::text(const std::string& key) const {
  auto it = file.metadata().find(key);
  if (it == file.metadata().end()) file.fail("metadata \"", key, "\" is missing: not a complete kiln checkpoint");
  return it->second;
}

KILN_COMPILED std::int64_t MetaReader::integer(const std::string& key) const {
  const std::string& s = text(key);
  std::int64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc{} || r.ptr != s.data() + s.size())
    file.fail("metadata \"", key, "\" = \"", s, "\" is not an integer");
  return v;
}

KILN_COMPILED std::uint64_t MetaReader::u64(const std::string& key) const {
  const std::string& s = text(key);
  std::uint64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc{} || r.ptr != s.data() + s.size())
    file.fail("metadata \"", key, "\" = \"", s, "\" is not an unsigned integer");
  return v;
}

KILN_COMPILED double MetaReader::real(const std::string& key) const {
  const std::string& s = text(key);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) file.fail("metadata \"", key, "\" = \"", s, "\" is not a number");
  return v;
}

KILN_COMPILED void write_checkpoint(const std::string& path, const CheckpointedStep& step,
                                    const CheckpointValues& values, TrainPosition position,
                                    const std::map<std::string, std::string>& extra) {
  KILN_CHECK(values.micro_batches % step.accumulation == 0, ValueError,
             "save_checkpoint: the step is inside an accumulation (", values.micro_batches % step.accumulation, " of ",
             step.accumulation, " micro-batches); save right after an optimizer step");
  io::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.set_metadata("kiln.format", checkpoint_format);
  add_model_state(w, step.model);

  const optim::ParamTable& table = *step.table;
  const auto names = slot_names(step.model, table);
  std::vector<std::vector<std::int64_t>> shapes;  // each slot's: its parameter's
  for (const auto& name : names) shapes.push_back(shape_of(step.model, name));
  for (const auto& buf : step.buffers) {
    for (index_t k = 0; k < table.count(); ++k) {
      std::vector<std::uint8_t> bytes(std::size_t(table[k].size) * sizeof(float));
      step.copy_to_host(bytes.data(), buf.data + table.offset(k), bytes.size());
      w.add(std::string(optimizer_prefix) + buf.name + "." + names[std::size_t(k)], dtype::f32,
            shapes[std::size_t(k)], bytes);
    }
  }
  for (index_t k = 0; k < table.count(); ++k) {
    const std::int64_t v = values.counters[std::size_t(k)];
    w.add_values<std::int64_t>(std::string(optimizer_prefix) + step.counter_name + "." + names[std::size_t(k)], {},
                               {&v, 1});
  }
  auto meta = [&](const std::string& key, const std::string& value) { w.set_metadata("kiln." + key, value); };
  meta("optimizer", step.optimizer);
  meta("optimizer.steps", std::to_string(values.optimizer_counter));
  meta("optimizer.lr", number_text(values.lr));
  meta("precision", values.precision);
  meta("accumulate", std::to_string(step.accumulation));
  meta("micro_batches", std::to_string(values.micro_batches));
  meta("optimizer_steps", std::to_string(values.optimizer_steps));
  meta("epoch", std::to_string(position.epoch));
  meta("batch", std::to_string(position.batch));
  const ScalerState& s = values.scaler;
  meta("scaler.enabled", step.scaler_enabled ? "1" : "0");
  meta("scaler.scale", number_text(s.scale));
  meta("scaler.growth_tracker", std::to_string(s.growth_tracker));
  meta("scaler.steps", std::to_string(s.steps));
  meta("scaler.skipped", std::to_string(s.skipped));
  meta("scaler.floor_step", std::to_string(s.floor_step));
  for (const auto& rng : step.model.rngs) {
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

KILN_COMPILED ReadCheckpoint read_checkpoint(const std::string& path, const CheckpointedStep& step) {
  ReadCheckpoint out;
  out.file = std::make_shared<const io::SafetensorsFile>(io::SafetensorsFile::open(path));
  const io::SafetensorsFile& file = *out.file;  // the bytes `apply` copies from live as long as `out`
  if (!file.has_checksum()) file.fail("has no kiln checksum (", io::checksum_key, "): not a kiln checkpoint");
  const MetaReader meta{file};
  if (meta.text("kiln.format") != checkpoint_format)
    file.fail("kiln.format is \"", meta.text("kiln.format"), "\", this kiln reads \"", checkpoint_format, "\"");
  if (meta.text("kiln.optimizer") != step.optimizer)
    file.fail("was written with optimizer ", meta.text("kiln.optimizer"), ", this run uses ", step.optimizer);

  stage_model_state(file, step.model, LoadOptions{}, out.apply);

  const optim::ParamTable& table = *step.table;
  const auto names = slot_names(step.model, table);
  std::vector<std::string> expected;  // every optimizer tensor this optimizer has
  for (const auto& buf : step.buffers) {
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
      out.apply.push_back([dst, bytes, copy = step.copy_from_host] { copy(dst, bytes.data(), bytes.size()); });
    }
  }
  CheckpointValues& v = out.values;
  for (index_t k = 0; k < table.count(); ++k) {
    const std::string name = std::string(optimizer_prefix) + step.counter_name + "." + names[std::size_t(k)];
    expected.push_back(name);
    std::int64_t c = 0;
    file.read(name, dtype::i64, {}, &c);
    if (c < 0) file.fail("tensor \"", name, "\" = ", c, " is negative");
    v.counters.push_back(index_t(c));
  }
  for (const auto& t : file.tensors())
    if (t.name.rfind(optimizer_prefix, 0) == 0 &&
        std::find(expected.begin(), expected.end(), t.name) == expected.end())
      file.fail("holds optimizer state \"", t.name, "\" that this ", step.optimizer,
                " does not have (other options, e.g. amsgrad or momentum, or frozen parameters?)");

  v.optimizer_counter = index_t(meta.integer("kiln.optimizer.steps"));
  v.lr = meta.real("kiln.optimizer.lr");
  CheckpointInfo& info = out.info;
  info.path = path;
  info.micro_batches = index_t(meta.integer("kiln.micro_batches"));
  info.optimizer_steps = index_t(meta.integer("kiln.optimizer_steps"));
  info.position = {index_t(meta.integer("kiln.epoch")), index_t(meta.integer("kiln.batch"))};
  if (info.position.epoch < 0 || info.position.batch < 0)
    file.fail("the loader position (epoch ", info.position.epoch, ", batch ", info.position.batch, ") is negative");
  const std::int64_t accumulate = meta.integer("kiln.accumulate");
  if (accumulate != step.accumulation)
    file.fail("was written with ", accumulate, " micro-batches per optimizer step, this run uses ", step.accumulation);
  const bool scaler_on = meta.integer("kiln.scaler.enabled") != 0;
  if (scaler_on != step.scaler_enabled)
    file.fail("was written with loss scaling ", scaler_on ? "on" : "off", ", this run has it ",
              step.scaler_enabled ? "on" : "off", " (another --precision?)");
  v.scaler.scale = float(meta.real("kiln.scaler.scale"));
  v.scaler.growth_tracker = index_t(meta.integer("kiln.scaler.growth_tracker"));
  v.scaler.steps = index_t(meta.integer("kiln.scaler.steps"));
  v.scaler.skipped = index_t(meta.integer("kiln.scaler.skipped"));
  v.scaler.floor_step = index_t(meta.integer("kiln.scaler.floor_step"));
  for (const auto& rng : step.model.rngs) {
    const std::uint64_t seed = meta.u64("kiln.rng." + rng.prefix + "seed");
    const std::uint64_t offset = meta.u64("kiln.rng." + rng.prefix + "offset");
    out.apply.push_back([set = rng.set, seed, offset] { set(seed, offset); });
  }
  if (info.micro_batches != info.optimizer_steps * step.accumulation)
    file.fail(info.micro_batches, " micro-batches are not ", info.optimizer_steps, " optimizer steps of ",
              step.accumulation);
  info.metadata = file.metadata();
  return out;
}

}  // namespace kiln::train::detail

namespace kiln::train {

KILN_COMPILED std::uint32_t state_checksum(const io::ModelState& state) {
  std::uint32_t crc = 0;
  std::vector<std::uint8_t> bytes;
  for (const auto& t : state.tensors) {
    bytes.resize(t.bytes);
    t.copy_to_host(bytes.data(), t.data, t.bytes);
    crc = io::crc32c(bytes.data(), bytes.size(), crc);
  }
  return crc;
}

}  // namespace kiln::train

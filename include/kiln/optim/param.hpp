// kiln/optim/param.hpp — parameters as an optimizer sees them: a table of (value, grad, size).
//
// The optimizers treat all parameters as ONE flat index space, the concatenation of the table's
// slots in order, so a step is one fused loop (one kernel on a device) however many tensors the
// model has. Optimizer state (momentum, exp_avg, ...) lives in one contiguous buffer per kind,
// where parameter k's state starts at offset(k).
//
// A slot may point at its variable's "holds a gradient" flag (PyTorch's `.grad is not None`):
// optimizers, grad_norm and clipping skip a slot whose flag is false, and zero_grad clears it.
//
//   kiln::optim::ParamTable table;
//   table.add(w.data(), dw.data(), w.size());
//   table.add(b.data(), db.data(), b.size());
//   kiln::optim::AdamW opt(table, {.lr = 1e-3});   // from a table: AdamW<kiln::host>
//   kiln::optim::AdamW both(encoder.param_table() + head.param_table(), {});  // tables concatenate
//   kiln::optim::AdamW from_model(model, {});      // AdamW<Model::space> over model.param_table()
// A table does not know its memory space: over device pointers write AdamW<kiln::cuda>(table, ...)
// or build the optimizer from the model.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <vector>

#include "kiln/backend/cpu/executor.hpp"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/core/view.hpp"

namespace kiln::optim {

// One parameter: `size` floats at `value`, its gradient at `grad`. The table does not own them.
// requires: value and grad do not overlap (the update loops read grad while writing value).
struct ParamSlot {
  float* value = nullptr;
  float* grad = nullptr;
  index_t size = 0;
  // The variable's "holds a gradient" flag (ag::VarNode::grad_valid), read on the host at each
  // step; nullptr means the gradient buffer always counts. A slot whose flag is false is skipped:
  // its value and optimizer state stay as they are, as PyTorch skips a parameter whose .grad is
  // None. requires: the flag outlives every table and optimizer holding the slot.
  bool* has_grad = nullptr;
  // Whether the optimizer's weight decay applies to it: false for a parameter group without decay
  // (a GPT's biases, LayerNorms and embeddings, nanoGPT's rule; models::GPT::param_table).
  bool decays = true;

  bool has_gradient() const { return has_grad == nullptr || *has_grad; }
};

class ParamTable {
 public:
  ParamTable() = default;
  ParamTable(std::initializer_list<ParamSlot> slots) {
    for (const ParamSlot& s : slots) add(s);
  }

  // Appends a parameter; returns its index in the table.
  // throws: ValueError for a negative size, null pointers, or a value already in the table (a
  //   parameter listed twice would be updated twice per step).
  index_t add(const ParamSlot& slot) {
    KILN_CHECK(slot.size >= 0, ValueError, "ParamTable::add: parameter ", slots_.size(), " has size ", slot.size,
               "; sizes must be >= 0");
    KILN_CHECK(slot.size == 0 || (slot.value != nullptr && slot.grad != nullptr), ValueError,
               "ParamTable::add: parameter ", slots_.size(), " of size ", slot.size,
               " needs non-null value and grad pointers");
    if (slot.size > 0)
      for (std::size_t k = 0; k < slots_.size(); ++k)
        KILN_CHECK(slots_[k].value != slot.value, ValueError, "ParamTable::add: parameter ", slots_.size(),
                   " has the value pointer of parameter ", k, "; a parameter may appear in a table only once");
    slots_.push_back(slot);
    offsets_.push_back(offsets_.back() + slot.size);
    return index_t(slots_.size()) - 1;
  }
  index_t add(float* value, float* grad, index_t size, bool* has_grad = nullptr) {
    return add(ParamSlot{value, grad, size, has_grad});
  }

  // Appends every parameter of `other`, in order (their offsets follow this table's).
  ParamTable& append(const ParamTable& other) {
    for (const ParamSlot& s : other.slots_) add(s);
    return *this;
  }
  // The parameters of a, then those of b: a model of several modules as one table.
  friend ParamTable operator+(ParamTable a, const ParamTable& b) {
    a.append(b);
    return a;
  }
  ParamTable& operator+=(const ParamTable& other) { return append(other); }

  // Number of parameters (tensors) in the table.
  index_t count() const { return index_t(slots_.size()); }
  // Number of elements over all parameters: the length of each optimizer state buffer.
  index_t total_size() const { return offsets_.back(); }
  // Where parameter k starts in the flat index space.
  index_t offset(index_t k) const { return offsets_[std::size_t(k)]; }

  const ParamSlot& operator[](index_t k) const { return slots_[std::size_t(k)]; }
  // Puts parameter k in the group without weight decay (ParamSlot::decays).
  void exclude_from_decay(index_t k) { slots_[std::size_t(k)].decays = false; }
  const std::vector<ParamSlot>& slots() const { return slots_; }
  auto begin() const { return slots_.begin(); }
  auto end() const { return slots_.end(); }

  // Calls f(slot, local_begin, local_end, flat_begin) for each piece of the flat range [b, e)
  // that lies in one parameter, in order. flat_begin is the flat index of local_begin, so the
  // state of element i of the piece sits at state[flat_begin + (i - local_begin)].
  // requires: 0 <= b <= e <= total_size().
  template <class F>
  void for_each_span(index_t b, index_t e, F&& f) const {
    for_each_slot_span(b, e, [&](index_t, const ParamSlot& s, index_t lb, index_t le, index_t fb) { f(s, lb, le, fb); });
  }

  // The same, with the parameter's index first: f(k, slot, local_begin, local_end, flat_begin).
  template <class F>
  void for_each_slot_span(index_t b, index_t e, F&& f) const {
    if (b >= e) return;
    // The last slot starting at or before b; empty slots share their successor's offset, and
    // upper_bound steps past them.
    std::size_t k = std::size_t(std::upper_bound(offsets_.begin(), offsets_.end(), b) - offsets_.begin()) - 1;
    while (b < e) {
      const index_t off = offsets_[k], stop = std::min(e, offsets_[k + 1]);
      if (stop > b) f(index_t(k), slots_[k], b - off, stop - off, b);
      b = std::max(b, stop);
      ++k;
    }
  }

 private:
  std::vector<ParamSlot> slots_;
  std::vector<index_t> offsets_{0};  // count() + 1 entries: offsets_[k] .. offsets_[k + 1] is slot k
};

// What an optimizer keeps between steps, as a checkpoint (kiln/train/checkpoint.hpp) saves and
// restores it. Every optimizer gives
//   std::vector<StateBuffer> state_buffers();       // float buffers laid out like table()
//   std::vector<index_t> param_counters() const;    // one integer per parameter (counter_name)
//   void set_param_counters(const std::vector<index_t>&);
//   void set_steps(index_t);                        // the count steps() returns
// The buffers' pointers are in the optimizer's memory space; state_buffers() creates a buffer an
// optimizer makes lazily (SGD's momentum), so a restored one can be written into it.
struct StateBuffer {
  const char* name;  // PyTorch's key in optimizer.state[p]: "exp_avg", "momentum_buffer", ...
  float* data;       // table().total_size() floats; parameter k's part starts at table().offset(k)
};

// A step's guard (PyTorch's GradScaler.step skipping optimizer.step on inf/NaN gradients):
// found_inf points at one float in the optimizer's memory space (device memory for a CUDA
// optimizer), written by whatever checked the gradients earlier on the same stream. When it
// holds a non-zero value as the update runs, opt.step(exec, guard) changes nothing: values,
// state buffers, per-parameter step counts and momentum-buffer starts stay bit for bit. The
// fused CUDA step decides this on the device (no host synchronisation); the CPU and every
// force_eager step read it on the host. nullptr: the step always runs.
struct StepGuard {
  const float* found_inf = nullptr;
};

namespace detail {
// Whether a guard skips this step, read on the host (a host optimizer's flag is host memory).
inline bool host_guard_skips(const StepGuard& guard) { return guard.found_inf != nullptr && *guard.found_inf != 0.0f; }

// A parameter (or its piece of a state buffer) as a 1-D view, for the force_eager updates.
template <class S, class T>
using FlatView = View<T, S, extents<dyn>>;
}  // namespace detail

// What an optimizer can be built from besides a ParamTable: a model with param_table() and a
// memory space (kiln::nn::Sequential, or anything shaped like it). The optimizer's space is the
// model's: optim::AdamW opt(model, {}) is an AdamW<Model::space>.
template <class M>
concept param_model = requires(const M& m) {
  typename M::space;
  { m.param_table() } -> std::convertible_to<ParamTable>;
};

// Elements in the slots that hold a gradient now (the work of a step).
inline index_t size_with_gradient(const ParamTable& table) {
  index_t n = 0;
  for (const ParamSlot& s : table)
    if (s.has_gradient()) n += s.size;
  return n;
}

// PyTorch 2's Optimizer.zero_grad(set_to_none). With set_to_none (the default) a slot with a flag
// is set to "no gradient" (no kernel: the next backward writes it) and slots without one are
// zero-filled; without set_to_none every gradient is zero-filled and flagged slots hold a
// gradient (zeros: an AdamW step still decays them). The fill is one launch of kind::elementwise
// "zero_grad", none when no slot needs it.
inline void zero_grad(const ParamTable& table, CpuExecutor& exec, bool set_to_none = true) {
  index_t n = 0;
  bool any = false;
  for (const ParamSlot& s : table) {
    const bool fill = !set_to_none || s.has_grad == nullptr;
    if (fill) n += s.size;
    any = any || fill;
  }
  if (any) {
    exec.stats().count(kind::elementwise, "zero_grad", n, std::size_t(n) * sizeof(float));
    exec.parallel_for(table.total_size(), CpuExecutor::grain, [&](index_t b, index_t e) {
      table.for_each_span(b, e, [&](const ParamSlot& s, index_t lb, index_t le, index_t) {
        if (!set_to_none || s.has_grad == nullptr) std::fill(s.grad + lb, s.grad + le, 0.0f);
      });
    });
  }
  for (const ParamSlot& s : table)
    if (s.has_grad != nullptr) *s.has_grad = !set_to_none;
}

}  // namespace kiln::optim

// kiln/train/captures.hpp — the captured steps of mode::reduce_overhead, one per batch shape and
// micro-batch position, and the stance's answer to a shape not seen before.
//
// train::Step owns one. A capture holds what a replay needs at fixed addresses: the graph (the
// executor's step_graph: kiln/backend/cpu/step_graph.hpp, kiln/backend/cuda/step_graph.cuh),
// the static input and label buffers a batch is copied into,
// the loss variable the graph writes, and which parameters hold a gradient after it (a replay
// skips the autograd, so it sets those flags itself). It also keeps the parameters' addresses and
// trainable flags at capture: a model whose parameters moved or were frozen since is captured
// again rather than replayed on stale addresses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/autograd/var.hpp"
#include "kiln/backend/cpu/step_graph.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/optim/param.hpp"
#include "kiln/policy/stance.hpp"

namespace kiln::train {

// What one mode::reduce_overhead run did, for the step's report.
struct CaptureCounts {
  index_t captured_steps = 0;  // steps that ran while being captured
  index_t replays = 0;         // steps replayed from a capture
  index_t eager_steps = 0;     // steps that ran through the autograd tape, uncaptured
};

namespace detail {

// The parameters a capture was made with: addresses (value and gradient) and trainable flags.
struct ParamSignature {
  std::vector<const void*> addresses;
  std::vector<bool> trainable;

  template <class Model>
  static ParamSignature of(const Model& model) {
    ParamSignature s;
    model.for_each_parameter([&](const auto& v) {
      s.addresses.push_back(v.value().data());
      s.addresses.push_back(v.grad().data());
      s.trainable.push_back(v.requires_grad());
    });
    return s;
  }
  // Whether `model` still matches (allocates nothing).
  template <class Model>
  bool matches(const Model& model) const {
    std::size_t a = 0, t = 0;
    bool same = true;
    model.for_each_parameter([&](const auto& v) {
      same = same && a + 1 < addresses.size() && t < trainable.size() && addresses[a] == v.value().data() &&
             addresses[a + 1] == v.grad().data() && trainable[t] == v.requires_grad();
      a += 2;
      ++t;
    });
    return same && a == addresses.size() && t == trainable.size();
  }
};

}  // namespace detail

// The graph type an executor captures into (cpu::StepGraph where it names none).
template <class Exec, class = void>
struct step_graph_of {
  using type = cpu::StepGraph;
};
template <class Exec>
struct step_graph_of<Exec, std::void_t<typename Exec::step_graph>> {
  using type = typename Exec::step_graph;
};

template <class Input, class Graph = cpu::StepGraph>
struct Capture {
  using space = typename Input::space;
  index_t rows = 0, position = 0;
  // False while the shape is warming up (an executor whose capture does not run the step, CUDA,
  // runs it once eagerly first); true once captured, replayable or not.
  bool captured = false;
  Graph graph;
  Input input;  // the batch's features are copied here before each replay
  Tensor<std::int32_t, space, dyn> labels;
  ag::Var<float, space> loss;
  std::vector<bool> grads_after;  // per optimizer-table slot: holds a gradient after the step
  detail::ParamSignature params;
  index_t replays = 0;
};

template <class Input, class Graph = cpu::StepGraph>
class Captures {
 public:
  using capture_type = Capture<Input, Graph>;

  explicit Captures(index_t max_shapes) : max_shapes_(max_shapes) {
    KILN_CHECK(max_shapes >= 1, ValueError, "train::StepOptions::max_captured_shapes must be >= 1, got ", max_shapes);
  }

  // The capture for this shape and position, if any (nullptr otherwise).
  capture_type* find(index_t rows, index_t position) {
    for (auto& c : all_)
      if (c->rows == rows && c->position == position) return c.get();
    return nullptr;
  }

  // Whether a step of `rows` rows with no capture yet is captured (true) or runs eagerly
  // (false), as the stance (its name) says; throws for fail_on_recompile and past the cap.
  bool admit(index_t rows, index_t dim, std::string_view stance_name) const {
    const bool known = has_rows(rows);
    if (known || all_.empty()) return true;  // a new position of a known shape, or the first shape
    if (stance_name == stance::eager_on_recompile::name) return false;
    KILN_CHECK(stance_name != stance::fail_on_recompile::name, ValueError,
               "train::Step: mode reduce_overhead under stance fail_on_recompile met batch shape [", rows, ", ", dim,
               "], which was not captured; captured: ", shapes(dim),
               ". Give every batch one size (drop or pad the last one), or use stance::eager_on_recompile");
    KILN_CHECK(distinct_rows() < max_shapes_, ValueError, "train::Step: mode reduce_overhead would capture a ",
               distinct_rows() + 1, "th batch shape, [", rows, ", ", dim, "], past the cap of ", max_shapes_,
               " (StepOptions::max_captured_shapes); captured: ", shapes(dim),
               ". Batches of ever new sizes defeat capture: use fixed sizes, raise the cap, or use "
               "stance::eager_on_recompile");
    return true;
  }

  capture_type& add(index_t rows, index_t position) {
    // A capture of this key is replaced (its pool lives on until its blocks are back).
    for (auto& c : all_)
      if (c->rows == rows && c->position == position) {
        c = std::make_unique<capture_type>();
        c->rows = rows;
        c->position = position;
        return *c;
      }
    all_.push_back(std::make_unique<capture_type>());
    all_.back()->rows = rows;
    all_.back()->position = position;
    return *all_.back();
  }
  void remove(index_t rows, index_t position) {
    for (auto it = all_.begin(); it != all_.end(); ++it)
      if ((*it)->rows == rows && (*it)->position == position) {
        all_.erase(it);
        return;
      }
  }
  void clear() { all_.clear(); }

  // "[64, 400], [16, 400]"
  std::string shapes(index_t dim) const {
    std::string out;
    std::vector<index_t> seen;
    for (const auto& c : all_) {
      bool dup = false;
      for (index_t r : seen) dup = dup || r == c->rows;
      if (dup) continue;
      seen.push_back(c->rows);
      out += (out.empty() ? "[" : ", [") + std::to_string(c->rows) + ", " + std::to_string(dim) + "]";
    }
    return out.empty() ? "none" : out;
  }
  const std::vector<std::unique_ptr<capture_type>>& all() const { return all_; }
  CaptureCounts& counts() { return counts_; }
  const CaptureCounts& counts() const { return counts_; }
  index_t max_shapes() const { return max_shapes_; }

 private:
  bool has_rows(index_t rows) const {
    for (const auto& c : all_)
      if (c->rows == rows) return true;
    return false;
  }
  index_t distinct_rows() const {
    index_t n = 0;
    for (std::size_t i = 0; i < all_.size(); ++i) {
      bool first = true;
      for (std::size_t j = 0; j < i; ++j) first = first && all_[j]->rows != all_[i]->rows;
      n += first ? 1 : 0;
    }
    return n;
  }

  index_t max_shapes_;
  std::vector<std::unique_ptr<capture_type>> all_;
  CaptureCounts counts_;
};

}  // namespace kiln::train

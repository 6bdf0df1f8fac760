// kiln/autograd/tape.hpp — records the backward step of each materialised op (a kernel or a
// library call) and runs, for one loss, exactly the steps that loss depends on.
//
//   auto la = nn::cross_entropy(tape, head_a.forward(tape, x), y);
//   auto lb = nn::cross_entropy(tape, head_b.forward(tape, x), y);
//   tape.backward(la);   // head a's graph only
//   tape.backward(lb);   // head b's graph: both heads get the gradients backward(la + lb) gives
//
// Semantics, as PyTorch's autograd except where noted:
// - The graph belongs to the results (var.hpp): the steps behind a dropped result are freed at
//   once. The tape only numbers the steps it records (their order is a topological order) and
//   counts those alive, warning once when they pile up (results computed outside NoGrad and kept).
// - backward(loss) seeds d(loss)/d(loss) = 1 and runs the steps `loss` depends on in reverse order
//   of recording; gradients of intermediate results start afresh in each backward, gradients of
//   leaves (parameters) accumulate until zero_grad().
// - It releases each step as soon as it ran (PyTorch's order: a result no caller holds dies
//   with its gradient there, so activations and gradients are not all alive at backward's peak),
//   unless a step still alive and not run (the graph of another loss that shares this one's
//   trunk) needs it. So, unlike PyTorch, two losses over a
//   shared trunk can be backwarded in turn without retain_graph. A released result can not be
//   backwarded through again: that throws, naming the result's shape. BackwardOptions::
//   retain_graph keeps every step (backward the same loss twice, for instance).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/autograd/anomaly.hpp"
#include "kiln/autograd/var.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/core/warning.hpp"
#include "kiln/expr/assign.hpp"

namespace kiln::ag {

namespace detail {
inline bool& grad_mode() {
  thread_local bool enabled = true;
  return enabled;
}
// Global counters: steps from several tapes may meet in one graph, and their order must agree.
inline std::atomic<std::uint64_t>& step_counter() {
  static std::atomic<std::uint64_t> next{0};
  return next;
}
inline std::atomic<std::uint64_t>& traversal_counter() {
  static std::atomic<std::uint64_t> next{0};
  return next;
}
template <class Exec>
inline constexpr char exec_key = 0;

// backward()'s first kernel: d(loss)/d(loss) = seed (times *scale when scale is set).
template <class T>
struct Seed {
  T* g;
  const float* scale;
  double seed;
  KILN_HOST_DEVICE void operator()(index_t, index_t) const {
    g[0] = scale ? T(compute_t<T>(*scale) * compute_t<T>(seed)) : T(seed);
  }
};
}  // namespace detail

inline bool grad_enabled() { return detail::grad_mode(); }

// Within its scope nothing is recorded and results need no gradient (evaluation, metrics).
class NoGrad {
 public:
  NoGrad() : previous_(detail::grad_mode()) { detail::grad_mode() = false; }
  ~NoGrad() { detail::grad_mode() = previous_; }
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool previous_;
};

struct BackwardOptions {
  bool retain_graph = false;  // keep every step that ran, to run it again
  // The seed d(loss)/d(loss): `seed`, times *seed_scale when that is set — a float in the loss's
  // memory space read by the seed kernel (a loss scaler's scale on the device: no host sync).
  // A training step seeds scale / N to scale the loss and average N accumulated micro-batches.
  double seed = 1.0;
  const float* seed_scale = nullptr;
  // Called once per leaf that requires a gradient (a parameter) as soon as its gradient is final
  // in this backward — after the last step that writes it — while later steps still run: a
  // data-parallel step starts all-reducing it then (kiln/dist/data_parallel.hpp).
  std::function<void(VarNode&)> on_leaf_ready = {};
};

namespace detail {
[[noreturn, gnu::cold, gnu::noinline]] inline void eager_form_missing(const char* op) {
  throw ValueError(std::string("stance::force_eager reached ") + op +
                   ", whose force_eager form no file of this program compiled (KILN_FORCE_EAGER_FORMS 0): "
                   "#include <kiln/force_eager.hpp> in the file that makes the force_eager tape or step");
}

// Runs stance::force_eager's form of an op: a weak function template (KILN_WEAK), null where no
// file of the program compiled it (KILN_FORCE_EAGER_FORMS, kiln/force_eager.hpp).
// The address is read through a volatile: GCC folds `&f == nullptr` to false for a function
// template's specialization even when it is declared weak.
template <class F, class... Args>
decltype(auto) run_eager_form(F* form, const char* op, Args&&... args) {
  F* const volatile linked = form;
  if (linked == nullptr) eager_form_missing(op);
  return linked(std::forward<Args>(args)...);
}
}  // namespace detail

struct TapeOptions {
  // Warn (once per tape) when more backward steps than this are alive, or more than 8 times
  // the largest graph a backward() has run — whichever is larger.
  std::size_t warn_alive_steps = 1024;
  // stance::force_eager for everything recorded on this tape: every expression node is its own
  // kernel forward and backward, and a Linear's bias and activation leave its GEMM's epilogue —
  // the baseline fusion is measured against, and a way to debug a fused result. The ops' forms
  // for it come with their headers unless a file turns them off (KILN_FORCE_EAGER_FORMS).
  bool force_eager = false;
};

template <class Exec>
class Tape {
  struct Step final : GradFn {
    std::function<void(Exec&)> run;
    std::string region;  // the launch-stats region it was recorded in (an opaque layer)
    std::string label;   // anomaly mode: the layer that recorded it
  };

 public:
  using executor_type = Exec;
  explicit Tape(Exec& exec, TapeOptions options = {}) : exec_(&exec), options_(options) {}

  Exec& exec() const { return *exec_; }
  bool recording() const { return grad_enabled(); }
  bool force_eager() const { return options_.force_eager; }
  // Backward steps recorded on this tape that are still alive: held by results that no backward
  // has consumed yet (0 after a training step whose results are gone or backwarded).
  std::size_t size() const { return *alive_; }

  // Records the backward step of the op that made `out` from `inputs`: rule(exec, out's node)
  // reads out's gradient and writes (or adds to) the inputs' gradients. out takes ownership of
  // the step; the step of each input that needs a gradient runs after it.
  // requires: recording() (ops check it first: they skip saving what backward needs otherwise).
  template <class T, class S, index_t... D, class Rule>
  void record(const Var<T, S, D...>& out, std::vector<std::shared_ptr<VarNode>> inputs, Rule rule) {
    using Data = typename Var<T, S, D...>::data_type;
    Data* od = out.data().get();  // raw: the step is owned by *od, so *od outlives it
    attach(*od, std::move(inputs), [od, rule = std::move(rule)](Exec& exec) { rule(exec, *od); });
  }

  // record() for a step that reaches `out` through its untyped node (VarNode: the gradient as
  // ensure_grad_data()): the step's code is then shared by outputs of every size.
  void record_node(VarNode& out, std::vector<std::shared_ptr<VarNode>> inputs, std::function<void(Exec&)> run) {
    attach(out, std::move(inputs), std::move(run));
  }

  // d(loss)/d(every variable loss depends on that requires a gradient); see the header comment.
  template <class T, class S, index_t... D>
  void backward(const Var<T, S, D...>& loss, BackwardOptions options = {}) {
    static_assert(((D == 1 || D == dyn) && ...),
                  "kiln: backward() needs a scalar loss; reduce it first (kiln::ag::mean or kiln::ag::sum)");
    KILN_CHECK(loss.value().size() == 1, ShapeError, "backward() needs a scalar loss, got shape ",
               loss.shape().str(), "; reduce it first (kiln::ag::mean or kiln::ag::sum)");
    auto& root = *loss.data();
    KILN_CHECK(!root.graph_freed || root.grad_fn, ValueError,
               "backward(): this loss was already backwarded and its graph freed; to backward it again, pass "
               "{.retain_graph = true} to the first backward()");
    KILN_CHECK(loss.requires_grad(), ValueError,
               "backward(): the loss does not depend on any variable that requires a gradient");
    std::vector<Visit> steps = collect(loss.data());
    // Which steps this backward frees once they ran (all of them unless retain_graph or another
    // loss's unrun steps share them); decided up front so each goes as soon as it ran.
    const std::vector<bool> freed = options.retain_graph ? std::vector<bool>(steps.size(), false) : releasable(steps);
    // Gradients of intermediate results hold this backward's contributions only.
    for (const Visit& v : steps) v.node->grad_valid = false;
    T* g = root.ensure_grad();
    exec_->for_each_element(1, 1, detail::Seed<T>{g, options.seed_scale, options.seed}, kind::elementwise, "seed",
                            sizeof(T) + (options.seed_scale ? sizeof(float) : 0));
    root.grad_valid = true;
    // With on_leaf_ready: how many of these steps write each leaf's gradient (a step may list a
    // leaf twice, x * x: counted twice).
    std::unordered_map<VarNode*, std::size_t> writers;
    if (options.on_leaf_ready)
      for (const Visit& v : steps)
        for (const auto& in : v.step->inputs)
          if (in->requires_grad && !in->grad_fn) ++writers[in.get()];
    for (std::size_t i = 0; i < steps.size(); ++i) {
      Visit& v = steps[i];
      Step& step = static_cast<Step&>(*v.step);
      if (step.region.empty()) {
        step.run(*exec_);
      } else {  // a backward step of an opaque region is named after it too
        std::string outer = exec_->stats().set_region(step.region);
        step.run(*exec_);
        exec_->stats().set_region(std::move(outer));
      }
      if (detect_anomaly()) check_backward(step);
      if (options.on_leaf_ready)
        for (const auto& in : step.inputs)
          if (in->requires_grad && !in->grad_fn && --writers[in.get()] == 0) options.on_leaf_ready(*in);
      // Every consumer of this result ran before its step, so nothing of this backward reads its
      // value or gradient again: releasing the step now drops the activations it saved and the
      // inputs it held, and the result itself (with its gradient) unless the caller still holds
      // it — PyTorch's order, so the activations and the gradients are not alive together at the
      // peak of backward.
      if (freed[i]) release(v);
    }
    largest_graph_ = std::max(largest_graph_, steps.size());
  }

 private:
  // What record() does whatever the op: one function per executor, not one per op.
  [[gnu::noinline]] void attach(VarNode& out, std::vector<std::shared_ptr<VarNode>>&& inputs,
                                std::function<void(Exec&)> run) {
    auto step = std::make_shared<Step>();
    step->run = std::move(run);
    step->inputs = std::move(inputs);
    for (const auto& in : step->inputs) ++in->consumers;
    step->seq = detail::step_counter()++;
    step->exec_key = &detail::exec_key<Exec>;
    step->live = alive_;
    step->region = exec_->stats().region();
    if (detect_anomaly()) step->label = detail::anomaly_label();
    ++*alive_;
    out.grad_fn = std::move(step);
    out.graph_freed = false;
    if (!warned_ && *alive_ > alive_limit()) warn_growth();
  }

  // Anomaly mode: the gradients the step just wrote into its inputs must be finite (what flowed
  // into it was checked when its consumer ran).
  static void check_backward(const Step& step) {
    for (const auto& in : step.inputs) {
      if (!in->requires_grad) continue;
      const index_t bad = in->first_nonfinite_grad();
      KILN_CHECK(bad < 0, NumericError, "anomaly mode: the backward of ",
                 step.label.empty() ? std::string("an op outside any model layer") : step.label,
                 " wrote a non-finite gradient at element ", bad, " of an input of shape ", in->shape_text(),
                 " (the gradient it received was finite)");
    }
  }

  struct Visit {
    std::shared_ptr<VarNode> node;  // held: releasing a consumer's step may drop the last owner
    std::shared_ptr<GradFn> step;
  };

  std::size_t alive_limit() const { return std::max(options_.warn_alive_steps, 8 * largest_graph_); }

  void warn_growth() {
    warned_ = true;
    warn(kiln::detail::concat(*alive_, " backward steps recorded on one tape are alive and no backward() has consumed them; "
                                 "results computed with gradients on keep their graph and activations as long as "
                                 "they live. Compute evaluations and metrics inside a kiln::ag::NoGrad scope (or "
                                 "drop the results)"));
  }

  // The steps `root` depends on, in the order they must run (decreasing seq).
  static std::vector<Visit> collect(const std::shared_ptr<VarNode>& root) {
    const std::uint64_t mark = ++detail::traversal_counter();
    std::vector<Visit> steps;
    std::vector<std::shared_ptr<VarNode>> todo{root};
    while (!todo.empty()) {
      std::shared_ptr<VarNode> node = std::move(todo.back());
      todo.pop_back();
      if (!node->grad_fn) {
        KILN_CHECK(!node->graph_freed, ValueError,
                   "backward(): the loss depends on a result whose graph an earlier backward() freed; the "
                   "gradients of everything before it would be missing. Record that result again, or pass "
                   "{.retain_graph = true} to the earlier backward()");
        continue;
      }
      GradFn& step = *node->grad_fn;
      if (step.visited == mark) continue;
      step.visited = mark;
      KILN_CHECK(step.exec_key == &detail::exec_key<Exec>, ValueError,
                 "backward(): part of the graph was recorded on a tape of another executor type");
      for (const auto& in : step.inputs)
        if (in->requires_grad) todo.push_back(in);
      steps.push_back({std::move(node), nullptr});
      steps.back().step = steps.back().node->grad_fn;
    }
    std::sort(steps.begin(), steps.end(), [](const Visit& a, const Visit& b) { return a.step->seq > b.step->seq; });
    return steps;
  }

  // Which steps may be freed once they ran: each unless a step that does not run in this backward
  // still consumes its result. Steps run consumers first, so one pass in that order decides: a
  // result may go when every consumer of it is a step released here.
  static std::vector<bool> releasable(const std::vector<Visit>& steps) {
    std::vector<bool> freed(steps.size(), false);
    std::unordered_map<const VarNode*, std::size_t> released_consumers;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const VarNode* node = steps[i].node.get();
      if (node->consumers != released_consumers[node]) continue;
      freed[i] = true;
      for (const auto& in : steps[i].step->inputs) ++released_consumers[in.get()];
    }
    return freed;
  }

  // Frees a step that ran, and lets go of its result (which dies here unless held elsewhere).
  static void release(Visit& v) {
    VarNode& node = *v.node;
    v.step.reset();
    node.grad_fn.reset();  // the step dies here: its saved buffers and its hold on its inputs
    node.graph_freed = true;
    node.fold.reset();  // the producer's offer (and its saved buffers) can no longer be taken
    node.fold_key = nullptr;
    v.node.reset();
  }

  Exec* exec_;
  TapeOptions options_;
  std::shared_ptr<std::size_t> alive_ = std::make_shared<std::size_t>(0);
  std::size_t largest_graph_ = 0;
  bool warned_ = false;
};

}  // namespace kiln::ag

// kiln/train/step.hpp — one training step, the same code on the CPU and CUDA executors, its
// behaviour chosen by a policy bag (kiln/policy/policy.hpp).
//
//   kiln::data::BatchLoader<Model::space> loader(train, {.batch_size = 64}, exec);
//   kiln::optim::AdamW opt(model, {.lr = 1e-3});
//   kiln::train::Step step(model, opt, exec, kiln::policy<kiln::accumulate<4>>{});
//   for (...) { loader.start_epoch(e); while (const auto* batch = loader.next()) step(*batch); }
//
// step(batch) runs one micro-batch: the batch into the step's input (one copy within the model's
// space), forward, loss, and backward seeded with scale / N (the loss scaler's scale, 1 without
// one; N micro-batches per optimizer step). Every N-th call then also runs the loss scaler's
// unscale-and-check, the optimizer (a no-op, decided on the device, when a gradient holds inf or
// NaN), the scaler's update, and sets the gradients to none. Nothing waits for the device: the
// loss comes back as a variable in the model's space, and the step keeps a window of the losses
// that take_losses() reads every few steps (one synchronisation per window on CUDA).
//
// The policy's stance reaches forward, backward and optimizer alike: under force_eager every
// expression node is its own kernel, a Linear's bias and activation leave its GEMM's epilogue and
// the optimizer updates one tensor at a time, node by node. The launches of one optimizer step are
// known at compile time (predicted_launches(), kiln/train/launches.hpp).
//
// The policy's mode (kiln/policy/mode.hpp): under mode::reduce_overhead on the CPU the first
// micro-batch at each batch shape (and position within an accumulation) is captured — forward,
// loss and backward (kiln/train/captures.hpp) — and later ones copy the batch into the
// capture's buffers and replay it: no tape, no allocation, the same results bit for bit. The
// optimizer part (loss-scaler check, optimizer, scaler update) runs after it as usual, so the
// learning rate and step counts are read fresh every step. The loss a replay returns is the
// capture's variable: the next replay at that shape overwrites it (read losses with
// take_losses(), as a training loop does). A shape not captured before is captured, run eagerly
// (stance::eager_on_recompile) or refused (stance::fail_on_recompile); anomaly mode runs every
// step eagerly. On CUDA, reduce_overhead runs as default for now (describe() says so).
//
// Compile cost: a Step is its policy's part only — the forward and backward in its precision and
// the optimizer in its stance. Everything the policy does not change (counts, loss window,
// schedule, scaler, recording, the data-parallel reducer) is StepBase (kiln/train/step_base.hpp),
// compiled once per model, optimizer and executor; code that takes a StepBase& (a training loop,
// checkpoints, report()) is compiled once for every policy. Choosing a policy at run time:
// kiln/train/select_step.hpp.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/nn/mixed_check.hpp"
#include "kiln/policy/policy.hpp"
#include "kiln/train/captures.hpp"
#include "kiln/train/launches.hpp"
#include "kiln/train/step_base.hpp"
#include "kiln/tune/gemm_tuner.hpp"

namespace kiln::train {

// The GEMM autotuner mode::max_autotune installs on an executor: the one it names
// (`using gemm_tuner`, CUDA's cu::LtTuner), the CPU GEMM tuner on a host executor, else none.
template <class Exec, class = void>
struct gemm_tuner_of {
  using type = std::conditional_t<std::is_same_v<typename Exec::space, host>, tune::GemmTuner, void>;
};
template <class Exec>
struct gemm_tuner_of<Exec, std::void_t<typename Exec::gemm_tuner>> {
  using type = typename Exec::gemm_tuner;
};

// What Policy switches on for a step on Exec, as values (StepBase::policy()).
template <class Policy, class Exec>
constexpr PolicyInfo policy_info() {
  using P = typename Policy::precision;
  return {.precision = P::name,
          .stance = Policy::stance::name,
          .mode = Policy::mode::name,
          .eager = std::is_same_v<typename Policy::stance, stance::force_eager>,
          .mixed = P::mixed,
          .scales_loss = Policy::loss_scaling::on,
          .tf32 = std::is_same_v<P, precision::tf32>,
          .bf16 = std::is_same_v<typename P::low_type, bf16>,
          .captures = Policy::mode::captures && requires { typename Exec::step_graph; },
          .autotunes = Policy::mode::autotunes && !std::is_void_v<typename gemm_tuner_of<Exec>::type>,
          .accumulate = Policy::accumulate};
}

template <class Model, class Optimizer, class Exec, class Policy = kiln::policy<>, class Loss = CrossEntropy>
class Step final : public StepBase<Model, Optimizer, Exec, Loss> {
  static_assert(is_policy_v<Policy>,
                "kiln::train::Step: the fourth argument is a policy bag, kiln::policy<...> (see kiln/policy/policy.hpp)");
  static_assert(!Policy::fullgraph || !Model::has_opaque,
                "kiln::train::Step: the policy says kiln::fullgraph, but the model has an opaque layer (nn::Opaque<F>), "
                "a fusion boundary kiln cannot see through; remove fullgraph or the opaque layer");
  // Under bf16_mixed / fp16_mixed every layer runs on half-precision activations; the first that
  // cannot is named by the compiler (kiln/nn/mixed_check.hpp).
  static_assert(nn::mixed_precision_required<Policy::precision::mixed, Model>::value);
  using Base = StepBase<Model, Optimizer, Exec, Loss>;

 public:
  using typename Base::space;
  using policy_type = Policy;
  // Whether the stance and the mode are values given when the step is made (stance::at_run_time,
  // mode::at_run_time: select_step's steps, one Step type for every stance and mode of a
  // precision) rather than Policy's tags.
  static constexpr bool stance_at_run_time = std::is_same_v<typename Policy::stance, stance::at_run_time>;
  static constexpr bool mode_at_run_time = std::is_same_v<typename Policy::mode, mode::at_run_time>;
  static constexpr PolicyInfo info = policy_info<Policy, Exec>();
  static constexpr bool eager = info.eager;
  // The kernels the optimizer and assignments run (the recompile stances run fused ones).
  using kernel_stance = stance::kernels_of<typename Policy::stance>;
  // Whether the capture code is compiled in (mode::reduce_overhead or at_run_time on an executor
  // that captures: the CPU's and CUDA's); capturing() says whether this step captures.
  static constexpr bool captures = info.captures;
  using graph_type = typename step_graph_of<Exec>::type;
  // mode::max_autotune's GEMM tuner on this executor (void where there is none).
  using tuner_type = typename gemm_tuner_of<Exec>::type;
  // Whether the GEMM tuner is compiled in (mode::max_autotune or at_run_time on the CPU and on
  // CUDA); autotuning() says whether this step tunes.
  static constexpr bool autotunes = info.autotunes;
  static constexpr bool scales_loss = info.scales_loss;
  static constexpr bool mixed = info.mixed;
  // The type GEMM inputs and saved activations are stored in (float unless mixed).
  using low_type = typename Policy::precision::low_type;
  using Input = ag::Var<low_type, space, dyn, Model::in_features>;
  // Labels per batch row: 1 for a classifier, T for a sequence model whose every position has a
  // next-token label (models::GPT says `labels_per_row = block_size`).
  static constexpr index_t labels_per_row = [] {
    if constexpr (requires { Model::labels_per_row; }) return index_t(Model::labels_per_row);
    else return index_t(1);
  }();

  Step(Model& model, Optimizer& optimizer, Exec& exec, Policy = {}, Loss loss = {}, StepOptions options = {})
      : Step(model, optimizer, exec, info, std::move(loss), std::move(options)) {
    static_assert(!stance_at_run_time && !mode_at_run_time,
                  "kiln::train::Step: a policy with stance::at_run_time or mode::at_run_time takes its stance and mode "
                  "as values: make the step with kiln::train::make_precision_step or select_step");
  }
  // A step of Policy's code that is another policy of the same code, as `as_policy` says (what
  // describe(), policy() and the executor's setup follow): select_step runs tf32 through fp32's
  // code this way (kiln/train/select_step.hpp), and a step of stance::at_run_time or
  // mode::at_run_time runs the stance and mode as_policy names. requires: as_policy differs from
  // info only in its precision's name and tf32, and in the stance and mode Policy leaves to run time.
  Step(Model& model, Optimizer& optimizer, Exec& exec, const PolicyInfo& as_policy, Loss loss, StepOptions options)
      : Base(model, optimizer, exec, as_policy, std::move(loss), options), captures_(options.max_captured_shapes) {
    KILN_CHECK(std::string_view(as_policy.stance) != stance::at_run_time::name &&
                   std::string_view(as_policy.mode) != mode::at_run_time::name,
               ValueError, "train::Step: the policy leaves its stance or mode to run time, and the PolicyInfo given "
               "names none (stance ", as_policy.stance, ", mode ", as_policy.mode, ")");
    if constexpr (mixed) model.template refresh_low_copies<low_type>(exec);
    optimizer.zero_grad(exec, /*set_to_none=*/true);
    if constexpr (autotunes) {
      if (autotuning()) {
        KILN_CHECK(exec.gemm_chooser() == nullptr, ValueError, "train::Step: mode max_autotune, but the executor ",
                   "already has a GEMM tuner (another max_autotune step on it?); give each its own executor");
        tuner_ = std::make_unique<tuner_type>(options.autotune);
        exec.set_gemm_chooser(tuner_.get());
      }
    }
  }
  ~Step() override {
    if constexpr (autotunes)
      if (tuner_ && this->exec_->gemm_chooser() == tuner_.get()) this->exec_->set_gemm_chooser(nullptr);
  }

  // Whether this step captures and replays (mode reduce_overhead, where the executor captures)
  // and whether it tunes its GEMMs (mode max_autotune, where the executor has a tuner).
  bool capturing() const { return captures && this->policy().captures; }
  bool autotuning() const { return autotunes && this->policy().autotunes; }

  // mode::max_autotune: the tuner (null in other modes).
  const auto* tuner() const { return tuner_.get(); }

  // mode::reduce_overhead: the captures (shape, position, launches, replays) and the counts of
  // captured, replayed and eager steps; forget_captures() drops them (the next step at each shape
  // captures again). Parameters that moved or changed their trainable flag are noticed without it.
  const Captures<Input, graph_type>& captures_made() const { return captures_; }
  void forget_captures() { captures_.clear(); }

  // What the mode did, a line or more for the end of a run: under reduce_overhead the captured
  // shapes, replayed / captured / eager steps and the first capture that could not be replayed
  // (and why); under max_autotune each GEMM shape's choice against the heuristic's.
  std::string mode_report() const override {
    std::string out = std::string("mode ") + this->policy().mode;
    if (capturing()) {
      const CaptureCounts& n = captures_.counts();
      out += kiln::detail::concat(": captured shapes ", captures_.shapes(Model::in_features), "; ", n.replays,
                                  " micro-batches replayed, ", n.captured_steps, " captured, ", n.eager_steps,
                                  " through the tape\n");
      for (const auto& c : captures_.all())
        if (c->captured && !c->graph.replayable())
          out += kiln::detail::concat("  [", c->rows, ", ", Model::in_features, "] runs through the tape at every step: ",
                                      c->graph.not_replayable(), " cannot be captured (a replay would skip it)\n");
    } else if (autotuning()) {
      if constexpr (autotunes) {
        const auto& path = tuner_->cache().path();
        out += kiln::detail::concat(": ", tuner_->tuned() + tuner_->reused(), " GEMM shapes, ", tuner_->tuned(),
                                    " timed now, ", tuner_->reused(), " read from the cache",
                                    path.empty() ? std::string(" (no cache)") : " " + path, "\n", tuner_->report());
      }
    } else if (!mode_built()) {
      out += ": not built for this executor yet (ran as default)\n";
    } else {
      out += "\n";
    }
    return out;
  }

  // Launches of one optimizer step, known at compile time for this model, loss, policy and the
  // optimizer's options (kiln/train/launches.hpp).
  // -1 when the model's launches are not known at compile time (a layer that does not say them,
  // e.g. an opaque function without a launches()).
  // With frozen layers (nn/freeze.hpp) the count follows the parameters' flags now.
  index_t predicted_launches() const override {
    if constexpr (!Model::counts_launches) {
      return -1;
    } else if constexpr (stance_at_run_time) {
      return this->policy().eager ? launches_under<counted_policy<Policy, stance::force_eager>>()
                                  : launches_under<counted_policy<Policy, stance::fused>>();
    } else {
      return launches_under<Policy>();
    }
  }

 private:
  template <class P>
  index_t launches_under() const {
    if constexpr (requires { this->model_->launches_now(nn::LaunchContext{}); })
      return launches_per_step_now<Model, Optimizer, P, Loss, space>(*this->model_, this->opt_->options(),
                                                                    this->accumulation());
    else
      return launches_per_step<Model, Optimizer, P, Loss, space>(this->opt_->options(), this->accumulation());
  }

  ag::Var<float, space> micro_batch(const float* features, const std::int32_t* labels, index_t rows) override {
    if constexpr (captures) {
      if (capturing() && !ag::detect_anomaly())
        if (auto loss = captured_step(features, labels, rows)) return *loss;
    }
    this->copy_input(input_, features, rows);  // not captured: through the tape
    auto loss = this->forward_backward(input_, labels);
    if (capturing()) ++captures_.counts().eager_steps;
    return loss;
  }

  void optimizer_step() override {
    auto& exec = *this->exec_;
    auto& scaler = this->scaler();
    const optim::StepGuard guard{scales_loss ? scaler.found_inf_ptr() : nullptr};
    if constexpr (scales_loss) scaler.unscale_and_check(this->opt_->table(), exec);
    if constexpr (stance_at_run_time) {
      if (this->policy().eager) this->opt_->template step<stance::force_eager>(exec, guard);
      else this->opt_->template step<stance::fused>(exec, guard);
    } else {
      this->opt_->template step<kernel_stance>(exec, guard);
    }
    if constexpr (scales_loss) scaler.update(exec);
    if constexpr (mixed) this->model_->template refresh_low_copies<low_type>(exec);
    this->opt_->zero_grad(exec, /*set_to_none=*/true);
    if constexpr (autotunes)
      if (tuner_) tuner_->save();  // only when something new was timed
  }

  void on_resume() override {
    captures_.clear();
    if constexpr (mixed) this->model_->template refresh_low_copies<low_type>(*this->exec_);
  }

  bool mode_built() const override {
    const std::string_view m = this->policy().mode;
    return !((m == mode::reduce_overhead::name && !captures) || (m == mode::max_autotune::name && !autotunes));
  }

  // mode::reduce_overhead: replays this shape's capture, or captures it; returns nothing when
  // the step is to run eagerly (stance::eager_on_recompile, a capture that cannot be replayed, or
  // the warm-up step of a shape on an executor whose capture does not run the step).
  std::optional<ag::Var<float, space>> captured_step(const float* features, const std::int32_t* labels, index_t rows) {
    Exec& exec = *this->exec_;
    const index_t position = this->micro_batches() % this->accumulation();
    auto* c = captures_.find(rows, position);
    if (c && c->captured && !c->graph.replayable()) return std::nullopt;
    const optim::ParamTable& table = this->opt_->table();
    if (c && c->captured && c->params.matches(*this->model_)) {
      this->copy_input(c->input, features, rows);
      exec.copy(c->labels.data(), labels, std::size_t(rows * labels_per_row) * sizeof(std::int32_t));
      exec.replay(c->graph);
      set_grad_flags(table, c->grads_after);
      ++c->replays;
      ++captures_.counts().replays;
      return c->loss;
    }
    if (!c) {
      if (!captures_.admit(rows, Model::in_features, this->policy().stance)) return std::nullopt;
      c = &captures_.add(rows, position);
      if constexpr (!Exec::capture_runs_work) return std::nullopt;  // the warm-up: eager; captured next time
    }
    // Capture (the first time, or again: the model's parameters moved or changed their trainable
    // flags). The batch into the capture's own buffers first — not part of the graph: a replay
    // copies the next batch there — then forward and backward with every launch kept.
    auto& fresh = c->captured ? captures_.add(rows, position) : *c;
    const std::vector<bool> flags_before = grad_flags(table);
    auto restore_flags = [&] { set_grad_flags(table, flags_before); };
    this->copy_input(fresh.input, features, rows);
    fresh.labels.resize(Shape{rows * labels_per_row});
    exec.copy(fresh.labels.data(), labels, std::size_t(rows * labels_per_row) * sizeof(std::int32_t));
    fresh.captured = true;
    exec.begin_capture(fresh.graph);
    try {
      fresh.loss = this->forward_backward(fresh.input, fresh.labels.data());
    } catch (const std::exception& e) {
      exec.end_capture();
      if constexpr (Exec::capture_runs_work) {
        captures_.remove(rows, position);  // a real error; the next step at this shape tries again
        throw;
      } else {  // nothing ran: the step runs eagerly, and this shape stays on the tape
        fresh.graph.set_not_replayable(std::string("the capture threw: ") + e.what());
        restore_flags();
        return std::nullopt;
      }
    }
    exec.end_capture();
    if constexpr (!Exec::capture_runs_work) {
      if (!fresh.graph.replayable()) {
        restore_flags();
        return std::nullopt;
      }
    }
    fresh.grads_after = grad_flags(table);
    fresh.params = detail::ParamSignature::of(*this->model_);
    if constexpr (!Exec::capture_runs_work) exec.replay(fresh.graph, /*count=*/false);  // the step's work
    ++captures_.counts().captured_steps;
    return fresh.loss;
  }

  // The parameters' has-gradient flags: a replay sets them as the captured backward left them
  // (the graph writes gradients but runs no host code), a failed capture puts them back.
  static std::vector<bool> grad_flags(const optim::ParamTable& table) {
    std::vector<bool> flags(std::size_t(table.count()));
    for (index_t k = 0; k < table.count(); ++k) flags[std::size_t(k)] = table[k].has_gradient();
    return flags;
  }
  static void set_grad_flags(const optim::ParamTable& table, const std::vector<bool>& flags) {
    for (index_t k = 0; k < table.count(); ++k)
      if (bool* flag = table[k].has_grad) *flag = flags[std::size_t(k)];
  }

  Input input_;
  Captures<Input, graph_type> captures_;
  std::unique_ptr<std::conditional_t<autotunes, tuner_type, int>> tuner_;  // mode::max_autotune's
};

}  // namespace kiln::train

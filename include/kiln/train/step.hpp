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
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/autograd/tape.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/dist/data_parallel.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/optim/param.hpp"
#include "kiln/optim/schedule.hpp"
#include "kiln/policy/policy.hpp"
#include "kiln/train/captures.hpp"
#include "kiln/train/grad_scaler.hpp"
#include "kiln/train/launches.hpp"
#include "kiln/train/loss.hpp"
#include "kiln/tune/gemm_tuner.hpp"

namespace kiln::train {

struct StepOptions {
  // Micro-batches per optimizer step when the policy says accumulate<kiln::dyn> (then >= 1); with a
  // count in the policy, 0 (or that count).
  index_t accumulate = 0;
  // Losses kept between reads (take_losses()): the latest loss_window of them; older ones are
  // dropped (and counted) when nobody reads them in time.
  index_t loss_window = 8;
  // The dynamic loss scaler's options, when the policy scales the loss.
  GradScalerOptions scaler = {};
  // Called after each micro-batch's backward with the count of micro-batches so far (from 1),
  // before the optimizer part of the step: to look at gradients, or to corrupt one on purpose
  // (tests of the loss scaler's skip). In a data-parallel step, at the last micro-batch before an
  // optimizer step it sees the gradients already averaged over the ranks (a change made there
  // stays on this rank).
  std::function<void(index_t micro_batch)> after_backward = {};
  // mode::reduce_overhead: the most batch shapes captured (past it: an error naming them).
  index_t max_captured_shapes = 8;
  // mode::max_autotune: where its cache lives and how long it times (kiln/tune/gemm_tuner.hpp).
  tune::GemmTunerOptions autotune = {};
  // Data-parallel training over this group (kiln/dist/data_parallel.hpp; on a GPU,
  // kiln/dist/device_reducer.cuh over NCCL): the ranks' models are checked alike and start from
  // rank 0's parameters, and each optimizer step averages the gradients over the ranks first. Each
  // rank feeds its own shard (LoaderOptions::shard). Null: this process alone. A group of one
  // rank is data-parallel over one rank (on a GPU its collectives run, as DDP's do at world size 1).
  dist::ProcessGroup* data_parallel = nullptr;
  dist::DataParallelOptions data_parallel_options = {};
};

namespace detail {
template <class P>
const auto* pointer_of(const P& p) {
  if constexpr (std::is_pointer_v<P>) return p;
  else return p.data();
}
}  // namespace detail

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

// The gradient reducer of a data-parallel step on an executor: the one it names (`using
// gradient_reducer`, CUDA's dist::DeviceGradientReducer on NCCL), else the host one on MPI.
template <class Exec, class = void>
struct gradient_reducer_of {
  using type = dist::GradientReducer;
};
template <class Exec>
struct gradient_reducer_of<Exec, std::void_t<typename Exec::gradient_reducer>> {
  using type = typename Exec::gradient_reducer;
};

template <class Model, class Optimizer, class Exec, class Policy = kiln::policy<>, class Loss = CrossEntropy>
class Step {
  static_assert(is_policy_v<Policy>,
                "kiln::train::Step: the fourth argument is a policy bag, kiln::policy<...> (see kiln/policy/policy.hpp)");
  static_assert(std::is_same_v<typename Model::space, typename Exec::space>,
                "kiln::train::Step: the model's parameters live in another memory space than the executor runs in; "
                "use Model::on<Space> for the executor's space");
  static_assert(Model::in_features != dyn,
                "kiln::train::Step: the model's first layer must fix its input size (e.g. a Linear<In, Out>)");
  static_assert(!Policy::fullgraph || !Model::has_opaque,
                "kiln::train::Step: the policy says kiln::fullgraph, but the model has an opaque layer (nn::Opaque<F>), "
                "a fusion boundary kiln cannot see through; remove fullgraph or the opaque layer");
  static_assert(!Policy::precision::mixed || Model::mixed_precision,
                "kiln::train::Step: under bf16_mixed / fp16_mixed every layer must run on half-precision activations; "
                "today Linear and the activations do (a layer says `mixed_precision = true`), use fp32 or tf32 for "
                "this model");

 public:
  using space = typename Model::space;
  using policy_type = Policy;
  static constexpr bool eager = std::is_same_v<typename Policy::stance, stance::force_eager>;
  // The kernels the optimizer and assignments run (the recompile stances run fused ones).
  using kernel_stance = stance::kernels_of<typename Policy::stance>;
  using mode_type = typename Policy::mode;
  // Whether steps are captured and replayed here (mode::reduce_overhead on an executor that
  // captures: the CPU's and CUDA's).
  static constexpr bool captures = Policy::mode::captures && requires { typename Exec::step_graph; };
  using graph_type = typename step_graph_of<Exec>::type;
  // mode::max_autotune's GEMM tuner on this executor (void where there is none).
  using tuner_type = typename gemm_tuner_of<Exec>::type;
  using reducer_type = typename gradient_reducer_of<Exec>::type;
  // Whether GEMMs are autotuned here (mode::max_autotune on the CPU and on CUDA).
  static constexpr bool autotunes = Policy::mode::autotunes && !std::is_void_v<tuner_type>;
  static constexpr bool scales_loss = Policy::loss_scaling::on;
  static constexpr bool mixed = Policy::precision::mixed;
  // The type GEMM inputs and saved activations are stored in (float unless mixed).
  using low_type = typename Policy::precision::low_type;
  using Input = ag::Var<low_type, space, dyn, Model::in_features>;

  Step(Model& model, Optimizer& optimizer, Exec& exec, Policy = {}, Loss loss = {}, StepOptions options = {})
      : model_(&model),
        opt_(&optimizer),
        exec_(&exec),
        loss_fn_(std::move(loss)),
        options_(options),
        tape_(exec, {.force_eager = eager}),
        scaler_(with_enabled(options.scaler, scales_loss)),
        window_(Shape{options.loss_window}),
        captures_(options.max_captured_shapes) {
    if constexpr (Policy::accumulate == dyn) {
      KILN_CHECK(options.accumulate >= 1, ValueError, "train::Step: the policy takes the accumulation count at run ",
                 "time (accumulate<kiln::dyn>), so StepOptions::accumulate must be >= 1, got ", options.accumulate);
      accumulate_ = options.accumulate;
    } else {
      KILN_CHECK(options.accumulate == 0 || options.accumulate == Policy::accumulate, ValueError,
                 "train::Step: StepOptions::accumulate = ", options.accumulate, " but the policy says accumulate<",
                 Policy::accumulate, ">; give the count in one place");
      accumulate_ = Policy::accumulate;
    }
    KILN_CHECK(options.loss_window >= 1, ValueError, "train::Step: loss_window must be >= 1, got ",
               options.loss_window);
    exec.allow_tf32(std::is_same_v<typename Policy::precision, precision::tf32>);
    if constexpr (std::is_same_v<low_type, bf16>)
      KILN_CHECK(exec.supports_bf16(), ValueError, "train::Step: precision bf16_mixed needs bfloat16 arithmetic, ",
                 "which ", exec.device_name(), " does not have (compute capability 8.0 or newer); use fp16_mixed");
    if (options.data_parallel != nullptr) {
      reducer_.emplace(*options.data_parallel, opt_->table(), options.data_parallel_options, exec);
      reducer_->check_same_model();
      reducer_->broadcast_parameters();
    }
    if constexpr (mixed) model.template refresh_low_copies<low_type>(exec);
    opt_->zero_grad(exec, /*set_to_none=*/true);
    if constexpr (autotunes) {
      KILN_CHECK(exec.gemm_chooser() == nullptr, ValueError, "train::Step: mode max_autotune, but the executor already ",
                 "has a GEMM tuner (another max_autotune step on it?); give each its own executor");
      tuner_ = std::make_unique<tuner_type>(options.autotune);
      exec.set_gemm_chooser(tuner_.get());
    }
  }
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;
  ~Step() {
    if constexpr (autotunes)
      if (tuner_ && exec_->gemm_chooser() == tuner_.get()) exec_->set_gemm_chooser(nullptr);
  }

  // The learning rate of optimizer step k is schedule.lr(k) (schedules count optimizer steps, not
  // micro-batches). `total_micro_batches`, when known (> 0), is checked against the schedule's
  // length: it must be a multiple of the accumulation count, and, for a schedule with a
  // total_steps(), give exactly that many optimizer steps.
  template <optim::LrSchedule S>
  void set_schedule(S schedule, index_t total_micro_batches = 0) {
    if (total_micro_batches > 0) {
      KILN_CHECK(total_micro_batches % accumulate_ == 0, ValueError, "train::Step: ", total_micro_batches,
                 " micro-batches are not a whole number of optimizer steps of ", accumulate_,
                 " micro-batches; the last ", total_micro_batches % accumulate_, " would never reach the optimizer");
      if constexpr (requires { schedule.total_steps(); }) {
        const index_t steps = total_micro_batches / accumulate_;
        KILN_CHECK(index_t(schedule.total_steps()) == steps, ValueError, "train::Step: the schedule runs ",
                   schedule.total_steps(), " optimizer steps but ", total_micro_batches, " micro-batches with ",
                   accumulate_, " per step make ", steps);
      }
    }
    schedule_ = [s = std::move(schedule)](index_t k) { return double(s.lr(k)); };
    opt_->set_lr(schedule_(optimizer_steps_));
  }

  // One micro-batch (see the header comment); returns its loss (mean over its rows, not scaled),
  // a scalar variable in the model's space.
  // requires: batch.dim equals the model's input size; the batch's memory is the model's space.
  template <class Batch>
  ag::Var<float, space> operator()(const Batch& batch) {
    static_assert(std::is_same_v<typename Batch::space, space>,
                  "kiln::train::Step: the batch lives in another memory space than the model; load it with "
                  "kiln::data::BatchLoader<Model::space>");
    return run(detail::pointer_of(batch.features), detail::pointer_of(batch.labels), batch.size, batch.dim);
  }

  // The same from raw pointers in the model's space: rows × dim features and rows labels.
  ag::Var<float, space> run(const float* features, const std::int32_t* labels, index_t rows, index_t dim) {
    KILN_CHECK(dim == Model::in_features, ShapeError, "train::Step: the batch has ", dim,
               " features per row but the model's input size is ", Model::in_features);
    KILN_CHECK(rows >= 0, ShapeError, "train::Step: the batch has ", rows, " rows");
    if (micro_batches_ % accumulate_ == 0 && record_next_) start_recording();
    std::optional<ag::Var<float, space>> loss;
    if constexpr (captures) {
      if (!ag::detect_anomaly()) loss = captured_step(features, labels, rows);
    }
    if (!loss) {  // not captured: through the tape
      copy_input(input_, features, rows);
      loss = forward_backward(input_, labels);
      if constexpr (captures) ++captures_.counts().eager_steps;
    }
    exec_->copy(window_.data() + window_next_, loss->value().data(), sizeof(float));
    window_next_ = (window_next_ + 1) % options_.loss_window;
    if (window_used_ == options_.loss_window) ++losses_dropped_;
    else ++window_used_;
    ++micro_batches_;
    stepped_ = micro_batches_ % accumulate_ == 0;
    // Data-parallel: the gradients averaged over the ranks before anyone looks at them (and
    // before the scaler's check: an overflow on any rank skips the step on every rank).
    if (stepped_ && reducer_) reducer_->finish();
    if (options_.after_backward) options_.after_backward(micro_batches_);
    if (stepped_) optimizer_step();
    if (stepped_ && recording_) stop_recording(rows);
    return *loss;
  }

  // Records what the executor launches during the next whole optimizer step (its names, kinds
  // and bytes), for report(); recording costs a little, so it is one step's worth.
  void record_next_step() { record_next_ = true; }
  // The launches of the last recorded optimizer step (empty before one was recorded).
  const std::vector<LaunchRecord>& recorded() const { return recorded_; }
  index_t recorded_batch() const { return recorded_batch_; }

  // The losses since the last read, in order; waits for the device. Also where a failure the
  // device recorded surfaces: the loss scaler's scale below its floor throws NumericError here,
  // and with require_finite so does the first NaN or infinite loss, naming its micro-batch
  // (counted from 1) — a run that diverged.
  std::vector<float> take_losses(bool require_finite = false) {
    std::vector<float> ring(static_cast<std::size_t>(options_.loss_window));
    memory_traits<space>::copy_to_host(ring.data(), window_.data(), ring.size() * sizeof(float));
    std::vector<float> out;  // oldest first: the ring's slots from the oldest kept one on
    for (index_t i = 0; i < window_used_; ++i)
      out.push_back(ring[std::size_t((window_next_ - window_used_ + i + options_.loss_window) % options_.loss_window)]);
    window_used_ = 0;
    scaler_.check();
    for (std::size_t i = 0; require_finite && i < out.size(); ++i)
      KILN_CHECK(std::isfinite(out[i]), NumericError, "the loss is ", out[i], " at micro-batch ",
                 micro_batches_ - index_t(out.size() - i) + 1, ": training diverged; lower the learning rate");
    return out;
  }
  index_t losses_pending() const { return window_used_; }
  // Losses overwritten before take_losses() read them.
  index_t losses_dropped() const { return losses_dropped_; }
  bool window_full() const { return window_used_ == options_.loss_window; }

  index_t accumulation() const { return accumulate_; }
  index_t micro_batches() const { return micro_batches_; }
  index_t optimizer_steps() const { return optimizer_steps_; }
  bool stepped() const { return stepped_; }  // whether the last call ran the optimizer
  // Between optimizer steps (no micro-batch of an accumulation pending): where a checkpoint can be
  // taken (kiln/train/checkpoint.hpp), since gradients are then none and need no saving.
  bool at_step_boundary() const { return micro_batches_ % accumulate_ == 0; }

  // mode::max_autotune: the tuner (null in other modes).
  const auto* tuner() const { return tuner_.get(); }

  // mode::reduce_overhead: the captures (shape, position, launches, replays) and the counts of
  // captured, replayed and eager steps; forget_captures() drops them (the next step at each shape
  // captures again). Parameters that moved or changed their trainable flag are noticed without it.
  const Captures<Input, graph_type>& captures_made() const { return captures_; }

  // What the mode did, a line or more for the end of a run: under reduce_overhead the captured
  // shapes, replayed / captured / eager steps and the first capture that could not be replayed
  // (and why); under max_autotune each GEMM shape's choice against the heuristic's.
  std::string mode_report() const {
    std::string out = std::string("mode ") + mode_type::name;
    if constexpr (captures) {
      const CaptureCounts& n = captures_.counts();
      out += kiln::detail::concat(": captured shapes ", captures_.shapes(Model::in_features), "; ", n.replays,
                                  " micro-batches replayed, ", n.captured_steps, " captured, ", n.eager_steps,
                                  " through the tape\n");
      for (const auto& c : captures_.all())
        if (c->captured && !c->graph.replayable())
          out += kiln::detail::concat("  [", c->rows, ", ", Model::in_features, "] runs through the tape at every step: ",
                                      c->graph.not_replayable(), " cannot be captured (a replay would skip it)\n");
    } else if constexpr (autotunes) {
      const auto& path = tuner_->cache().path();
      out += kiln::detail::concat(": ", tuner_->tuned() + tuner_->reused(), " GEMM shapes, ", tuner_->tuned(),
                                  " timed now, ", tuner_->reused(), " read from the cache",
                                  path.empty() ? std::string(" (no cache)") : " " + path, "\n", tuner_->report());
    } else if constexpr (mode_type::captures || mode_type::autotunes) {
      out += ": not built for this executor yet (ran as default)\n";
    } else {
      out += "\n";
    }
    return out;
  }
  void forget_captures() { captures_.clear(); }

  // Data-parallel training: the gradient reducer (null when this process trains alone).
  reducer_type* reducer() { return reducer_ ? &*reducer_ : nullptr; }

  // Continues a run from a checkpoint, after its model, optimizer and scaler state were loaded
  // (train::load_checkpoint calls this): the counts become the checkpoint's, the schedule's rate
  // is that of the next optimizer step, bf16 / f16 weight copies are rounded from the loaded
  // weights, gradients are none and the loss window is empty.
  // throws: ValueError when micro_batches is not optimizer_steps whole accumulations.
  void resume_at(index_t micro_batches, index_t optimizer_steps) {
    KILN_CHECK(micro_batches >= 0 && optimizer_steps >= 0 && micro_batches == optimizer_steps * accumulate_,
               ValueError, "train::Step::resume_at: ", micro_batches, " micro-batches are not ", optimizer_steps,
               " optimizer steps of ", accumulate_, " micro-batches (a checkpoint from a run with another "
               "--accumulate?)");
    micro_batches_ = micro_batches;
    optimizer_steps_ = optimizer_steps;
    stepped_ = false;
    captures_.clear();
    window_used_ = window_next_ = 0;
    if (schedule_) opt_->set_lr(schedule_(optimizer_steps_));
    if constexpr (mixed) model_->template refresh_low_copies<low_type>(*exec_);
    opt_->zero_grad(*exec_, /*set_to_none=*/true);
  }

  // One line for the start of a run: precision (and what it means on this executor), stance,
  // accumulation, loss scaling — with a note for choices that are legal but do nothing here.
  std::string describe() const {
    using P = typename Policy::precision;
    std::string out = std::string(P::name);
    if (std::is_same_v<P, precision::tf32> && !exec_->tf32_units())
      out += " (no TF32 units on " + exec_->device_name() + ": its GEMMs stay float)";
    else if (P::mixed && std::is_same_v<space, host>)
      out += " (emulated on the CPU: half-precision storage, float arithmetic, rounded at every store)";
    out += std::string(", stance ") + Policy::stance::name + ", " + std::to_string(accumulate_) +
           (accumulate_ == 1 ? " micro-batch" : " micro-batches") + " per optimizer step, loss scaling ";
    out += scales_loss ? "dynamic" : "off";
    if (scales_loss && !std::is_same_v<P, precision::fp16_mixed>)
      out += " (allowed, but pointless with float's exponent range)";
    out += std::string(", mode ") + mode_type::name;
    if ((mode_type::captures && !captures) || (mode_type::autotunes && !autotunes))
      out += " (not built for this executor yet: runs as default)";
    return out;
  }

  // Launches of one optimizer step, known at compile time for this model, loss, policy and the
  // optimizer's options (kiln/train/launches.hpp).
  // -1 when the model's launches are not known at compile time (a layer that does not say them,
  // e.g. an opaque function without a launches()).
  // With frozen layers (nn/freeze.hpp) the count follows the parameters' flags now.
  index_t predicted_launches() const {
    if constexpr (Model::counts_launches) {
      if constexpr (requires { model_->launches_now(nn::LaunchContext{}); })
        return launches_per_step_now<Model, Optimizer, Policy, Loss, space>(*model_, opt_->options(), accumulate_);
      else
        return launches_per_step<Model, Optimizer, Policy, Loss, space>(opt_->options(), accumulate_);
    } else {
      return -1;
    }
  }

  Model& model() const { return *model_; }
  Optimizer& optimizer() const { return *opt_; }
  Exec& exec() const { return *exec_; }
  ag::Tape<Exec>& tape() { return tape_; }
  GradScaler<space>& scaler() { return scaler_; }
  const Loss& loss() const { return loss_fn_; }

 private:
  static GradScalerOptions with_enabled(GradScalerOptions o, bool on) {
    o.enabled = on;
    return o;
  }

  void start_recording() {
    record_next_ = false;
    recording_ = true;
    was_recording_ = exec_->stats().recording();
    records_before_ = exec_->stats().records().size();
    exec_->stats().set_recording(true);
  }
  void stop_recording(index_t rows) {
    recording_ = false;
    const auto& all = exec_->stats().records();
    recorded_.assign(all.begin() + std::ptrdiff_t(records_before_), all.end());
    recorded_batch_ = rows;
    exec_->stats().set_recording(was_recording_);
  }

  // The batch into `in` (rounded to the low type under mixed precision): one launch.
  void copy_input(Input& in, const float* features, index_t rows) {
    const index_t n = rows * Model::in_features;
    in.value().resize(Shape{rows, Model::in_features});
    if constexpr (mixed) {
      exec_->for_each_element(1, n, nn::detail::RoundCopy<float, low_type>{features, in.value().data()}, kind::copy,
                              "round_input", std::size_t(n) * (sizeof(float) + sizeof(low_type)));
    } else {
      exec_->copy(in.value().data(), features, std::size_t(n) * sizeof(float));
    }
  }

  // Forward, loss and backward through the tape.
  ag::Var<float, space> forward_backward(Input& in, const std::int32_t* labels) {
    try {
      auto output = model_->forward(tape_, in);
      auto l = loss_fn_(tape_, output, labels);
      ag::BackwardOptions backward{.seed = 1.0 / double(accumulate_),
                                   .seed_scale = scales_loss ? scaler_.scale_ptr() : nullptr};
      // Data-parallel: the last micro-batch before an optimizer step all-reduces each bucket of
      // gradients as soon as backward has finished it (kiln/dist/data_parallel.hpp).
      if (reducer_ && reducer_->overlaps() && micro_batches_ % accumulate_ == accumulate_ - 1) {
        reducer_->begin_backward();
        backward.on_leaf_ready = [this](ag::VarNode& leaf) { reducer_->leaf_ready(leaf); };
      }
      tape_.backward(l, std::move(backward));
      return l;
    } catch (const NumericError& e) {
      if (!ag::detect_anomaly()) throw;
      // Anomaly mode (autograd/anomaly.hpp) names the layer; this says when.
      throw NumericError(kiln::detail::concat(e.what(), "; in optimizer step ", optimizer_steps_ + 1,
                                              ", micro-batch ", micro_batches_ + 1));
    }
  }

  // mode::reduce_overhead: replays this shape's capture, or captures it; returns nothing when
  // the step is to run eagerly (stance::eager_on_recompile, a capture that cannot be replayed, or
  // the warm-up step of a shape on an executor whose capture does not run the step).
  std::optional<ag::Var<float, space>> captured_step(const float* features, const std::int32_t* labels, index_t rows) {
    const index_t position = micro_batches_ % accumulate_;
    auto* c = captures_.find(rows, position);
    if (c && c->captured && !c->graph.replayable()) return std::nullopt;
    const optim::ParamTable& table = opt_->table();
    if (c && c->captured && c->params.matches(*model_)) {
      copy_input(c->input, features, rows);
      exec_->copy(c->labels.data(), labels, std::size_t(rows) * sizeof(std::int32_t));
      exec_->replay(c->graph);
      set_grad_flags(table, c->grads_after);
      ++c->replays;
      ++captures_.counts().replays;
      return c->loss;
    }
    if (!c) {
      if (!captures_.template admit<typename Policy::stance>(rows, Model::in_features)) return std::nullopt;
      c = &captures_.add(rows, position);
      if constexpr (!Exec::capture_runs_work) return std::nullopt;  // the warm-up: eager; captured next time
    }
    // Capture (the first time, or again: the model's parameters moved or changed their trainable
    // flags). The batch into the capture's own buffers first — not part of the graph: a replay
    // copies the next batch there — then forward and backward with every launch kept.
    auto& fresh = c->captured ? captures_.add(rows, position) : *c;
    const std::vector<bool> flags_before = grad_flags(table);
    auto restore_flags = [&] { set_grad_flags(table, flags_before); };
    copy_input(fresh.input, features, rows);
    fresh.labels.resize(Shape{rows});
    exec_->copy(fresh.labels.data(), labels, std::size_t(rows) * sizeof(std::int32_t));
    fresh.captured = true;
    exec_->begin_capture(fresh.graph);
    try {
      fresh.loss = forward_backward(fresh.input, fresh.labels.data());
    } catch (const std::exception& e) {
      exec_->end_capture();
      if constexpr (Exec::capture_runs_work) {
        captures_.remove(rows, position);  // a real error; the next step at this shape tries again
        throw;
      } else {  // nothing ran: the step runs eagerly, and this shape stays on the tape
        fresh.graph.set_not_replayable(std::string("the capture threw: ") + e.what());
        restore_flags();
        return std::nullopt;
      }
    }
    exec_->end_capture();
    if constexpr (!Exec::capture_runs_work) {
      if (!fresh.graph.replayable()) {
        restore_flags();
        return std::nullopt;
      }
    }
    fresh.grads_after = grad_flags(table);
    fresh.params = detail::ParamSignature::of(*model_);
    if constexpr (!Exec::capture_runs_work) exec_->replay(fresh.graph, /*count=*/false);  // the step's work
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

  void optimizer_step() {
    const optim::StepGuard guard{scales_loss ? scaler_.found_inf_ptr() : nullptr};
    if constexpr (scales_loss) scaler_.unscale_and_check(opt_->table(), *exec_);
    opt_->template step<kernel_stance>(*exec_, guard);
    if constexpr (scales_loss) scaler_.update(*exec_);
    if constexpr (mixed) model_->template refresh_low_copies<low_type>(*exec_);
    opt_->zero_grad(*exec_, /*set_to_none=*/true);
    ++optimizer_steps_;
    if (schedule_) opt_->set_lr(schedule_(optimizer_steps_));
    if constexpr (autotunes) tuner_->save();  // only when something new was timed
  }

  Model* model_;
  Optimizer* opt_;
  Exec* exec_;
  Loss loss_fn_;
  StepOptions options_;
  ag::Tape<Exec> tape_;
  GradScaler<space> scaler_;
  Input input_;
  Tensor<float, space, dyn> window_;  // a ring: the latest loss_window losses
  Captures<Input, graph_type> captures_;
  std::unique_ptr<std::conditional_t<autotunes, tuner_type, int>> tuner_;
  std::optional<reducer_type> reducer_;  // data-parallel training  // mode::max_autotune's
  index_t window_used_ = 0, window_next_ = 0, losses_dropped_ = 0;
  index_t accumulate_ = 1;
  index_t micro_batches_ = 0;
  index_t optimizer_steps_ = 0;
  bool stepped_ = false;
  std::function<double(index_t)> schedule_;
  bool record_next_ = false, recording_ = false, was_recording_ = false;
  std::size_t records_before_ = 0;
  std::vector<LaunchRecord> recorded_;
  index_t recorded_batch_ = 0;
};

}  // namespace kiln::train

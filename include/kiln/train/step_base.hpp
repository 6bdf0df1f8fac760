// kiln/train/step_base.hpp — what a training step is, whatever its policy: the interface a
// training loop drives, and every part of the step that the policy does not change.
//
// train::Step<Model, Optimizer, Exec, Policy, Loss> (kiln/train/step.hpp) derives from
// StepBase<Model, Optimizer, Exec, Loss>. The base holds the counts, the loss window, the
// schedule, the loss scaler, the tape and the launch recording, and runs a micro-batch's
// bookkeeping; the policy's part — the forward and backward in the policy's precision (captured
// and replayed under mode::reduce_overhead), and the optimizer step in its stance — is behind a
// few virtual functions. So:
//   - the code a loop, a checkpoint or a report compiles against a step is compiled once per
//     model, optimizer and executor, not once per policy: take a StepBase& (or AnyStep,
//     kiln/train/select_step.hpp) to drive steps whose policy is chosen at run time;
//   - a Step used as itself (its own type) is `final`, so those calls are direct.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
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
#include "kiln/data/batch_loader.hpp"
#include "kiln/dist/data_parallel.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/optim/param.hpp"
#include "kiln/optim/schedule.hpp"
#include "kiln/policy/info.hpp"
#include "kiln/policy/policy.hpp"
#include "kiln/train/grad_scaler.hpp"
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

template <class Model, class Optimizer, class Exec, class Loss = CrossEntropy>
class StepBase {
  static_assert(std::is_same_v<typename Model::space, typename Exec::space>,
                "kiln::train::Step: the model's parameters live in another memory space than the executor runs in; "
                "use Model::on<Space> for the executor's space");
  static_assert(Model::in_features != dyn,
                "kiln::train::Step: the model's first layer must fix its input size (e.g. a Linear<In, Out>)");

 public:
  using space = typename Model::space;
  using model_type = Model;
  using optimizer_type = Optimizer;
  using executor_type = Exec;
  using loss_type = Loss;
  using reducer_type = typename gradient_reducer_of<Exec>::type;

  StepBase(const StepBase&) = delete;
  StepBase& operator=(const StepBase&) = delete;
  virtual ~StepBase() = default;

  // One micro-batch: the batch into the step's input (one copy within the model's space),
  // forward, loss, and backward seeded with scale / N (the loss scaler's scale, 1 without one; N
  // micro-batches per optimizer step). Every N-th call then also runs the optimizer part of the
  // step. Returns its loss (mean over its rows, not scaled), a scalar variable in the model's space.
  // requires: batch.dim equals the model's input size; the batch's memory is the model's space.
  template <class Batch>
  ag::Var<float, space> operator()(const Batch& batch) {
    static_assert(std::is_same_v<typename Batch::space, space>,
                  "kiln::train::Step: the batch lives in another memory space than the model; load it with "
                  "kiln::data::BatchLoader<Model::space>");
    return run(data::pointer_of(batch.features), data::pointer_of(batch.labels), batch.size, batch.dim);
  }

  // The same from raw pointers in the model's space: rows × dim features and rows labels.
  ag::Var<float, space> run(const float* features, const std::int32_t* labels, index_t rows, index_t dim) {
    KILN_CHECK(dim == Model::in_features, ShapeError, "train::Step: the batch has ", dim,
               " features per row but the model's input size is ", Model::in_features);
    KILN_CHECK(rows >= 0, ShapeError, "train::Step: the batch has ", rows, " rows");
    if (micro_batches_ % accumulate_ == 0 && record_next_) start_recording();
    ag::Var<float, space> loss = micro_batch(features, labels, rows);
    exec_->copy(window_.data() + window_next_, loss.value().data(), sizeof(float));
    window_next_ = (window_next_ + 1) % options_.loss_window;
    if (window_used_ == options_.loss_window) ++losses_dropped_;
    else ++window_used_;
    ++micro_batches_;
    stepped_ = micro_batches_ % accumulate_ == 0;
    // Data-parallel: the gradients averaged over the ranks before anyone looks at them (and
    // before the scaler's check: an overflow on any rank skips the step on every rank).
    if (stepped_ && reducer_) reducer_->finish();
    if (options_.after_backward) options_.after_backward(micro_batches_);
    if (stepped_) {
      optimizer_step();
      ++optimizer_steps_;
      if (schedule_) opt_->set_lr(schedule_(optimizer_steps_));
    }
    if (stepped_ && recording_) stop_recording(rows);
    return loss;
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

  // Continues a run from a checkpoint, after its model, optimizer and scaler state were loaded
  // (train::load_checkpoint calls this): the counts become the checkpoint's, the schedule's rate
  // is that of the next optimizer step, bf16 / f16 weight copies are rounded from the loaded
  // weights, captures are dropped, gradients are none and the loss window is empty.
  // throws: ValueError when micro_batches is not optimizer_steps whole accumulations.
  void resume_at(index_t micro_batches, index_t optimizer_steps) {
    KILN_CHECK(micro_batches >= 0 && optimizer_steps >= 0 && micro_batches == optimizer_steps * accumulate_,
               ValueError, "train::Step::resume_at: ", micro_batches, " micro-batches are not ", optimizer_steps,
               " optimizer steps of ", accumulate_, " micro-batches (a checkpoint from a run with another "
               "--accumulate?)");
    micro_batches_ = micro_batches;
    optimizer_steps_ = optimizer_steps;
    stepped_ = false;
    window_used_ = window_next_ = 0;
    if (schedule_) opt_->set_lr(schedule_(optimizer_steps_));
    on_resume();
    opt_->zero_grad(*exec_, /*set_to_none=*/true);
  }

  // The policy, as values (its tags' names and what they switch on here).
  const PolicyInfo& policy() const { return info_; }

  // One line for the start of a run: precision (and what it means on this executor), stance,
  // accumulation, loss scaling — with a note for choices that are legal but do nothing here.
  std::string describe() const {
    std::string out = info_.precision;
    if (info_.tf32 && !exec_->tf32_units())
      out += " (no TF32 units on " + exec_->device_name() + ": its GEMMs stay float)";
    else if (info_.mixed && std::is_same_v<space, host>)
      out += " (emulated on the CPU: half-precision storage, float arithmetic, rounded at every store)";
    out += std::string(", stance ") + info_.stance + ", " + std::to_string(accumulate_) +
           (accumulate_ == 1 ? " micro-batch" : " micro-batches") + " per optimizer step, loss scaling ";
    out += info_.scales_loss ? "dynamic" : "off";
    if (info_.scales_loss && std::string_view(info_.precision) != "fp16_mixed")
      out += " (allowed, but pointless with float's exponent range)";
    out += std::string(", mode ") + info_.mode;
    if (!mode_built()) out += " (not built for this executor yet: runs as default)";
    return out;
  }

  // What the mode did, a line or more for the end of a run (see Step).
  virtual std::string mode_report() const = 0;

  // Launches of one optimizer step, known at compile time for this model, loss, policy and the
  // optimizer's options (kiln/train/launches.hpp); -1 when the model's launches are not known at
  // compile time. With frozen layers (nn/freeze.hpp) the count follows the parameters' flags now.
  virtual index_t predicted_launches() const = 0;

  Model& model() const { return *model_; }
  Optimizer& optimizer() const { return *opt_; }
  Exec& exec() const { return *exec_; }
  ag::Tape<Exec>& tape() { return tape_; }
  GradScaler<space>& scaler() { return scaler_; }
  const GradScaler<space>& scaler() const { return scaler_; }
  const Loss& loss() const { return loss_fn_; }
  // Data-parallel training: the gradient reducer (null when this process trains alone).
  reducer_type* reducer() { return reducer_ ? &*reducer_ : nullptr; }

 protected:
  StepBase(Model& model, Optimizer& optimizer, Exec& exec, const PolicyInfo& info, Loss loss, StepOptions options)
      : model_(&model),
        opt_(&optimizer),
        exec_(&exec),
        loss_fn_(std::move(loss)),
        options_(std::move(options)),
        info_(info),
        tape_(exec, {.force_eager = info.eager}),
        scaler_(with_enabled(options_.scaler, info.scales_loss)),
        window_(Shape{options_.loss_window}) {
    if (info.accumulate == dyn) {
      KILN_CHECK(options_.accumulate >= 1, ValueError, "train::Step: the policy takes the accumulation count at run ",
                 "time (accumulate<kiln::dyn>), so StepOptions::accumulate must be >= 1, got ", options_.accumulate);
      accumulate_ = options_.accumulate;
    } else {
      KILN_CHECK(options_.accumulate == 0 || options_.accumulate == info.accumulate, ValueError,
                 "train::Step: StepOptions::accumulate = ", options_.accumulate, " but the policy says accumulate<",
                 info.accumulate, ">; give the count in one place");
      accumulate_ = info.accumulate;
    }
    KILN_CHECK(options_.loss_window >= 1, ValueError, "train::Step: loss_window must be >= 1, got ",
               options_.loss_window);
    // take_losses copies the whole ring, slots no step has written yet included: zeros, not
    // uninitialised memory (compute-sanitizer's initcheck reports the read otherwise).
    memory_traits<space>::zero(window_.data(), window_.bytes());
    exec.allow_tf32(info.tf32);
    if (info.bf16)
      KILN_CHECK(exec.supports_bf16(), ValueError, "train::Step: precision bf16_mixed needs bfloat16 arithmetic, ",
                 "which ", exec.device_name(), " does not have (compute capability 8.0 or newer); use fp16_mixed");
    if (options_.data_parallel != nullptr) {
      reducer_.emplace(*options_.data_parallel, opt_->table(), options_.data_parallel_options, exec);
      reducer_->check_same_model();
      reducer_->broadcast_parameters();
    }
  }

  // The policy's part of a micro-batch: the batch in, forward, loss and backward (or a replay of
  // them); returns the loss.
  virtual ag::Var<float, space> micro_batch(const float* features, const std::int32_t* labels, index_t rows) = 0;
  // The policy's part of an optimizer step: the scaler's unscale-and-check, the optimizer, the
  // scaler's update, the low copies refreshed, gradients set to none.
  virtual void optimizer_step() = 0;
  // After resume_at moved the counts: what the policy keeps that a resume invalidates.
  virtual void on_resume() = 0;
  // Whether the policy's mode does what it says on this executor.
  virtual bool mode_built() const = 0;

  // The batch into `in` (rounded to the low type under mixed precision): one launch.
  template <class Input>
  void copy_input(Input& in, const float* features, index_t rows) {
    using low = typename Input::value_type;
    const index_t n = rows * Model::in_features;
    in.value().resize(Shape{rows, Model::in_features});
    if constexpr (!std::is_same_v<low, float>) {
      exec_->for_each_element(1, n, nn::detail::RoundCopy<float, low>{features, in.value().data()}, kind::copy,
                              "round_input", std::size_t(n) * (sizeof(float) + sizeof(low)));
    } else {
      exec_->copy(in.value().data(), features, std::size_t(n) * sizeof(float));
    }
  }

  // Forward, loss and backward through the tape.
  template <class Input>
  ag::Var<float, space> forward_backward(Input& in, const std::int32_t* labels) {
    try {
      auto output = model_->forward(tape_, in);
      auto l = loss_fn_(tape_, output, labels);
      ag::BackwardOptions backward{.seed = 1.0 / double(accumulate_),
                                   .seed_scale = info_.scales_loss ? scaler_.scale_ptr() : nullptr};
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

  const StepOptions& options() const { return options_; }

  Model* model_;
  Optimizer* opt_;
  Exec* exec_;

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

  Loss loss_fn_;
  StepOptions options_;
  PolicyInfo info_;
  ag::Tape<Exec> tape_;
  GradScaler<space> scaler_;
  Tensor<float, space, dyn> window_;  // a ring: the latest loss_window losses
  std::optional<reducer_type> reducer_;  // data-parallel training
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

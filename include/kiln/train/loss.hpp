// kiln/train/loss.hpp — losses as objects a training step holds: how to compute one from the
// model's output and a batch's labels, and what that launches.
//
// A loss type of your own gives the same three members: a `name`, operator()(tape, output,
// labels) returning a scalar variable, and `launches(ctx)` (forward + backward together, for the
// compile-time kernel count).
#pragma once

#include <cstdint>

#include "kiln/nn/loss.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::train {

// Cross-entropy of logits against integer class labels (nn::cross_entropy), PyTorch's options.
struct CrossEntropy {
  static constexpr const char* name = "cross_entropy";
  nn::CrossEntropyOptions options{};

  // A float loss, also from bf16 / f16 logits (mixed precision).
  template <class Exec, class T, class S, index_t B, index_t C>
  ag::Var<compute_t<T>, S> operator()(ag::Tape<Exec>& tape, const ag::Var<T, S, B, C>& logits,
                                      const std::int32_t* labels) const {
    return nn::cross_entropy(tape, logits, labels, options);
  }

  // A sequence model's logits [B, T, C] against B * T labels (position t of sample b at b * T + t).
  template <class Exec, class T, class S, index_t B, index_t L, index_t C>
  ag::Var<compute_t<T>, S> operator()(ag::Tape<Exec>& tape, const ag::Var<T, S, B, L, C>& logits,
                                      const std::int32_t* labels) const {
    return nn::cross_entropy(tape, logits, labels, options);
  }

  // Fused: ONE row kernel forward, ONE backward; on a device also the rows' sum (the host sums
  // inline) and a copy of the labels. force_eager: log_softmax and nll_loss, one kernel each way.
  static constexpr nn::Launches launches(const nn::LaunchContext& c) {
    const index_t device_extra = c.device ? 2 : 0;  // rows' sum, labels' copy
    if (c.eager) return {2 + device_extra, 2};
    return {1 + device_extra, 1};
  }
};

}  // namespace kiln::train

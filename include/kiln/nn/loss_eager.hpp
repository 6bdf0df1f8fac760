// kiln/nn/loss_eager.hpp — stance::force_eager's form of cross_entropy (kiln/force_eager.hpp):
// nll_loss(log_softmax(logits)), one kernel each way each. Included by kiln/nn/loss.hpp unless
// KILN_FORCE_EAGER_FORMS is 0 (kiln/config.hpp).
#pragma once

#include <cstdint>

#include "kiln/nn/loss.hpp"
#include "kiln/nn/softmax.hpp"

namespace kiln::nn::detail {

template <class Exec, class T, class S, index_t B, index_t C>
ag::Var<compute_t<T>, S> cross_entropy_eager(ag::Tape<Exec>& tape, const ag::Var<T, S, B, C>& logits,
                                             const std::int32_t* labels, CrossEntropyOptions options) {
  return nll_loss(tape, log_softmax(tape, logits), labels, options);
}

}  // namespace kiln::nn::detail

// kiln/nn/loss_eager.hpp — stance::force_eager's form of cross_entropy (kiln/force_eager.hpp):
// nll_loss(log_softmax(logits)), one kernel each way each. Included by kiln/nn/loss.hpp unless
// KILN_FORCE_EAGER_FORMS is 0 (kiln/config.hpp).
#pragma once

#include <cstdint>

#include "kiln/nn/loss.hpp"
#include "kiln/nn/softmax.hpp"

namespace kiln::nn::detail {

// On the logits' node, their shape at run time: compiled once per executor and element type.
template <class Exec, class T, class S>
ag::Var<compute_t<T>, S> cross_entropy_eager(ag::Tape<Exec>& tape, const std::shared_ptr<ag::VarNode>& x,
                                             const T* x_values, const Shape& shape, const std::int32_t* labels,
                                             CrossEntropyOptions options) {
  using LogP = ag::Var<compute_t<T>, S, dyn, dyn>;
  LogP logp{typename LogP::tensor_type(shape)};
  softmax_into<true, Exec, T>(tape, x, x_values, shape, logp.value().data(), *logp.data());
  return nll_loss_fused<Exec, compute_t<T>, S>(tape, logp.data(), logp.value().data(), shape, labels, options);
}

}  // namespace kiln::nn::detail

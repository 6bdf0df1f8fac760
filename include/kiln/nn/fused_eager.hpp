// kiln/nn/fused_eager.hpp — stance::force_eager's form of a layer's forward_fused<Act> (a
// convolution's, a batch norm's; kiln/force_eager.hpp): the layer's plain forward, then the
// activation as a kernel of its own. Included by kiln/nn/module.hpp unless
// KILN_FORCE_EAGER_FORMS is 0 (kiln/config.hpp).
#pragma once

#include "kiln/nn/module.hpp"

namespace kiln::nn::detail {

template <class Act, class Layer, class Exec, class X, class Y>
Y forward_fused_eager(const Layer& layer, ag::Tape<Exec>& tape, const X& x) {
  return Act{}.forward(tape, layer.forward(tape, x));
}

}  // namespace kiln::nn::detail

// kiln::kernels: the host instances of the row and element kernels of softmax, layer norm and the
// losses (kiln/nn/softmax.hpp, layernorm.hpp, loss.hpp) for float and double, compiled once.
#include "kiln/backend/cpu/executor.hpp"
#include "kiln/nn/layernorm.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/nn/softmax.hpp"

namespace kiln::nn::detail {

KILN_SOFTMAX_KERNELS(, float)
KILN_SOFTMAX_KERNELS(, double)
KILN_LAYER_NORM_KERNELS(, float)
KILN_LAYER_NORM_KERNELS(, double)
KILN_LOSS_KERNELS(, float)
KILN_LOSS_KERNELS(, double)

}  // namespace kiln::nn::detail

// kiln::kernels: the host instances of the row and element kernels of softmax, layer norm and the
// losses (kiln/nn/softmax.hpp, layernorm.hpp, loss.hpp) for float and double — softmax and
// cross-entropy also for bf16 and f16 inputs — and the bodies of softmax, nll_loss and
// cross_entropy (fused and force_eager) on their untyped operands, compiled once.
#include "kiln/backend/cpu/executor.hpp"
#include "kiln/nn/layernorm.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/nn/softmax.hpp"

namespace kiln::nn::detail {

KILN_SOFTMAX_KERNELS(, float)
KILN_SOFTMAX_KERNELS(, double)
KILN_SOFTMAX_KERNELS(, bf16)
KILN_SOFTMAX_KERNELS(, f16)
KILN_LAYER_NORM_KERNELS(, float)
KILN_LAYER_NORM_KERNELS(, double)
KILN_LOSS_KERNELS(, float)
KILN_LOSS_KERNELS(, double)
KILN_CROSS_ENTROPY_KERNELS(, bf16)
KILN_CROSS_ENTROPY_KERNELS(, f16)
KILN_CPU_CROSS_ENTROPY(, float)
KILN_CPU_CROSS_ENTROPY(, double)
KILN_CPU_CROSS_ENTROPY(, bf16)
KILN_CPU_CROSS_ENTROPY(, f16)
KILN_CPU_NLL_LOSS(, float)
KILN_CPU_NLL_LOSS(, double)
KILN_CPU_SOFTMAX(, float)
KILN_CPU_SOFTMAX(, double)
KILN_CPU_SOFTMAX(, bf16)
KILN_CPU_SOFTMAX(, f16)

}  // namespace kiln::nn::detail

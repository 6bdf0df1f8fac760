// kiln::kernels: dropout's host loops for each element type (kiln/nn/dropout.hpp), compiled once.
#include "kiln/nn/dropout.hpp"

namespace kiln::nn::detail {

KILN_DROPOUT_INSTANCES(, float)
KILN_DROPOUT_INSTANCES(, double)

}  // namespace kiln::nn::detail

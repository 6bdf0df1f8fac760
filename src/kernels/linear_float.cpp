// kiln::kernels: the CPU executor's linear ops (kiln/autograd/linear.hpp and linear_eager.hpp) —
// the GEMM with its bias and activation epilogue, the recorded backward, and the force_eager
// form — in float for kiln's common activations, compiled once for every layer width.
#include "kiln/autograd/linear.hpp"
#include "kiln/backend/cpu/executor.hpp"

namespace kiln::ag::detail {

KILN_CPU_LINEAR_FLOAT()

}  // namespace kiln::ag::detail

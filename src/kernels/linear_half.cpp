// kiln::kernels: the CPU executor's linear ops (kiln/autograd/linear.hpp and linear_eager.hpp) —
// the GEMM with its bias and activation epilogue, the recorded backward, and the force_eager
// form — in bf16 and f16 for the identity and ReLU, compiled once for every layer width.
#include "kiln/autograd/linear.hpp"
#include "kiln/backend/cpu/executor.hpp"

namespace kiln::ag::detail {

KILN_CPU_LINEAR_HALF()

}  // namespace kiln::ag::detail

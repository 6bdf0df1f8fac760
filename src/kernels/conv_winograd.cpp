// kiln::kernels: the CPU's Winograd F(2x2, 3x3) convolutions (kiln/backend/cpu/conv2d_winograd.hpp)
// for float and double, compiled once here instead of in every translation unit with a convnet.
#include "kiln/backend/cpu/conv2d_winograd.hpp"

namespace kiln::cpu {

KILN_CPU_WINOGRAD_INSTANCES(, float)
KILN_CPU_WINOGRAD_INSTANCES(, double)

}  // namespace kiln::cpu

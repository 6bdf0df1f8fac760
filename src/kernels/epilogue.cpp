// kiln::kernels: the CPU GEMM epilogues' passes for kiln's activations and element types
// (kiln/backend/cpu/epilogue.hpp), compiled once.
#include "kiln/backend/cpu/epilogue.hpp"

namespace kiln::cpu {

KILN_CPU_EPILOGUE_ACTIVATIONS()

}  // namespace kiln::cpu

// kiln::kernels: the CPU GEMM for each element type kiln computes in (kiln/backend/cpu/gemm.hpp),
// compiled once here instead of in every translation unit that runs a GEMM.
#include "kiln/backend/cpu/gemm.hpp"

namespace kiln::cpu {

KILN_CPU_GEMM_SOURCE_INSTANCES(, float)
KILN_CPU_GEMM_SOURCE_INSTANCES(, double)
KILN_CPU_GEMM_INSTANCES(, float)
KILN_CPU_GEMM_INSTANCES(, double)
KILN_CPU_GEMM_INSTANCES(, bf16)
KILN_CPU_GEMM_INSTANCES(, f16)
KILN_CPU_GEMM_ROUNDED_INSTANCES()

}  // namespace kiln::cpu

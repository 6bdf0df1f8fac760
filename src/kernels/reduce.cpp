// kiln::kernels: the CPU executor's reductions of plain views of float and double
// (kiln/backend/cpu/executor.hpp), compiled once.
#include "kiln/backend/cpu/executor.hpp"

namespace kiln {

KILN_CPU_REDUCTIONS()

}  // namespace kiln

// expect: the executor runs in a different memory space than the destination tensor
// A CPU executor cannot write into cuda memory (a view names it without allocating).
// Control: the view names host memory, the CPU executor's space.
#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::View<float, kiln::host, kiln::extents<4>> d;
#else
  kiln::View<float, kiln::cuda, kiln::extents<4>> d;
#endif
  kiln::assign(d, 1.0f, exec);
}

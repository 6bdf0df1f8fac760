// expect: the executor runs in a different memory space than the destination tensor
// A CPU executor cannot write into cuda memory (a view names it without allocating).
#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
  kiln::View<float, kiln::cuda, kiln::extents<4>> d;
  kiln::assign(d, 1.0f, exec);
}

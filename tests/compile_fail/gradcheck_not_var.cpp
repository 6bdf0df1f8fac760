// expect: kiln::gradcheck: the function must return a kiln::ag::Var
// gradcheck differentiates a variable; a plain number has no tape behind it.
// Control: the function returns the input variable itself.
#include <kiln/autograd/gradcheck.hpp>
// gradcheck multiplies its output with the expression operators, which gradcheck.hpp does not include.

int main() {
  using In = std::vector<kiln::GradcheckInput>;
#ifdef KILN_COMPILE_FAIL_CONTROL
  auto r = kiln::gradcheck([](kiln::ag::Tape<kiln::CpuExecutor>&, In& x) { return x[0]; },
                           In{kiln::GradcheckInput(kiln::HostMatrix<double>(1, 1), true)});
#else
  auto r = kiln::gradcheck([](kiln::ag::Tape<kiln::CpuExecutor>&, In& x) { return x[0].value().data()[0]; },
                           In{kiln::GradcheckInput(kiln::HostMatrix<double>(1, 1), true)});
#endif
  return r.ok ? 0 : 1;
}

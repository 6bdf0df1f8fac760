// expect: kiln::gradcheck: the function must return a kiln::ag::Var
// gradcheck differentiates a variable; a plain number has no tape behind it.
#include <kiln/autograd/gradcheck.hpp>

int main() {
  using In = std::vector<kiln::GradcheckInput>;
  auto r = kiln::gradcheck([](kiln::ag::Tape<kiln::CpuExecutor>&, In& x) { return x[0].value().data()[0]; },
                           In{kiln::GradcheckInput(kiln::HostMatrix<double>(1, 1), true)});
  return r.ok ? 0 : 1;
}

// A user's program built against the installed kiln package.
#include <cstdio>

#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
  kiln::Tensor<float, kiln::host, kiln::dyn> x(8), y(8);
  kiln::assign(x, 2.0f, exec);
  kiln::assign(y, kiln::maximum(x * 3.0f - 1.0f, 0.0f), exec);
  const bool ok = y(7) == 5.0f && exec.stats().launches() == 2;
  std::printf("%s\n", ok ? "consumer ok" : "consumer wrong result");
  return ok ? 0 : 1;
}

// expect: the template argument is a stance
// AdamW<kiln::cuda>::step<int>: step's template argument picks fused or force_eager kernels.
// Control: step<kiln::stance::force_eager>.
#include <kiln/train.cuh>

void update(kiln::optim::AdamW<kiln::cuda>& opt, kiln::CudaExecutor& exec) {
#ifdef KILN_COMPILE_FAIL_CONTROL
  opt.step<kiln::stance::force_eager>(exec);
#else
  opt.step<int>(exec);
#endif
}

int main() {}

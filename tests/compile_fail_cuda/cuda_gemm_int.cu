// expect: CUDA GEMM takes float, f16 or bf16 inputs
// An int GEMM on the CUDA executor (cuBLASLt is called for float and half types only).
// Control: the same call on float.
#include <kiln/cuda.cuh>

#ifdef KILN_COMPILE_FAIL_CONTROL
using Element = float;
#else
using Element = int;
#endif

void product(kiln::CudaExecutor& exec, const Element* a, const Element* b, float* c) {
  exec.gemm(false, false, 2, 2, 2, 1.f, a, 2, b, 2, 0.f, c, 2);
}

int main() {}

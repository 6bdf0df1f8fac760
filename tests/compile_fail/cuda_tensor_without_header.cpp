// expect: allocating cuda tensors needs #include <kiln/cuda.cuh>
// Constructing a cuda tensor from host-only code: memory_traits<cuda> lives in the CUDA headers.
// Control: a host-memory stand-in for the memory_traits<cuda> that kiln/cuda.cuh defines
// (kiln/backend/cuda/memory.cuh), so plain g++ shows the tensor itself is well-formed.
#include <kiln.hpp>

#ifdef KILN_COMPILE_FAIL_CONTROL
template <>
struct kiln::memory_traits<kiln::cuda> {
  static void* allocate(std::size_t bytes) { return kiln::memory_traits<kiln::host>::allocate(bytes); }
  static void deallocate(void* p, std::size_t bytes) noexcept { kiln::memory_traits<kiln::host>::deallocate(p, bytes); }
};
#endif

int main() {
  kiln::Tensor<float, kiln::cuda, 4> t;
  (void)t;
}

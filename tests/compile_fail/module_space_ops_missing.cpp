// expect: kiln::nn: no space_ops for this memory space
// A cuda Linear built without kiln/nn/cuda.cuh, which defines nn::space_ops<cuda>. Plain g++
// cannot include the CUDA headers, so a host-memory stand-in plays the memory_traits<cuda> of
// kiln/cuda.cuh (an nvcc file that includes kiln/cuda.cuh but not kiln/nn/cuda.cuh gets here).
// Control: a host-memory stand-in for the space_ops<cuda> of kiln/nn/cuda.cuh too.
#include <cstring>

#include <kiln/nn/linear.hpp>

template <>
struct kiln::memory_traits<kiln::cuda> {
  static void* allocate(std::size_t bytes) { return kiln::memory_traits<kiln::host>::allocate(bytes); }
  static void deallocate(void* p, std::size_t bytes) noexcept { kiln::memory_traits<kiln::host>::deallocate(p, bytes); }
  static void copy_to_host(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
  static void copy_from_host(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
};

#ifdef KILN_COMPILE_FAIL_CONTROL
template <>
struct kiln::nn::space_ops<kiln::cuda> {
  template <class T, kiln::index_t... D>
  static kiln::Tensor<T, kiln::cuda, D...> from_host(kiln::Tensor<T, kiln::host, D...>&& t) {
    kiln::Tensor<T, kiln::cuda, D...> r(t.shape());
    std::memcpy(r.data(), t.data(), t.bytes());
    return r;
  }
  template <class T>
  static void zero(T* p, kiln::index_t n) {
    std::memset(p, 0, std::size_t(n) * sizeof(T));
  }
};
#endif

int main() {
  kiln::nn::Linear<4, 8, true, float, kiln::cuda> layer;
  return int(layer.weight().value().size());
}

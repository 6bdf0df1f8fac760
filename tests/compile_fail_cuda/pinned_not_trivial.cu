// expect: PinnedBuffer<T> is filled by cudaMemcpy: T must be trivially copyable
// A page-locked buffer of std::string. Control: a buffer of int.
#include <kiln/cuda.cuh>

#include <string>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::cu::PinnedBuffer<int> buffer;
#else
  kiln::cu::PinnedBuffer<std::string> buffer;
#endif
  return int(buffer.size());
}

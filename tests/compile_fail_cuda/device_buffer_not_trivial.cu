// expect: DeviceBuffer<T> holds raw device memory copied with cudaMemcpy: T must be trivially copyable
// A device buffer of std::string: the buffer is moved with cudaMemcpy and never constructed.
// Control: a buffer of float.
#include <kiln/cuda.cuh>

#include <string>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::cu::DeviceBuffer<float> buffer;
#else
  kiln::cu::DeviceBuffer<std::string> buffer;
#endif
  return int(buffer.size());
}

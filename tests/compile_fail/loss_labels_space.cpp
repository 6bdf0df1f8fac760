// expect: cross_entropy: the labels must be in the logits' memory space
// Host logits with labels in cuda memory (taken by reference: nothing cuda is allocated here).
// Control: the labels in host memory.
#include <cstdint>

#include <kiln/backend/cpu/executor.hpp>
#include <kiln/nn/loss.hpp>

#ifdef KILN_COMPILE_FAIL_CONTROL
using Labels = kiln::Tensor<std::int32_t, kiln::host, 4>;
#else
using Labels = kiln::Tensor<std::int32_t, kiln::cuda, 4>;
#endif

kiln::ag::Var<float, kiln::host> loss(kiln::ag::Tape<kiln::CpuExecutor>& tape,
                                      const kiln::ag::Var<float, kiln::host, 4, 3>& logits, const Labels& labels) {
  return kiln::nn::cross_entropy(tape, logits, labels);
}

int main() {}

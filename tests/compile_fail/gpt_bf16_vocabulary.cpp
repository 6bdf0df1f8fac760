// expect: under bf16_mixed the batch's token ids travel as bfloat16, exact only up to 256
// Under bf16_mixed a train::Step hands the model its batch in bf16, so token ids above 256 would
// be rounded: a GPT with a larger vocabulary is refused at compile time, naming the limit.
// Control: the same model under fp32.
#include <kiln/models/gpt.hpp>
#include <kiln/train.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  using Precision = kiln::precision::fp32;
#else
  using Precision = kiln::precision::bf16_mixed;
#endif
  using Model = kiln::models::GPT<kiln::models::GptConfig{.vocab = 300, .block_size = 16, .layers = 1, .heads = 2, .width = 32}>;
  kiln::CpuExecutor exec;
  Model model;
  kiln::optim::AdamW opt(model, {});
  kiln::train::Step step(model, opt, exec, kiln::policy<Precision>{});
  (void)step;
}

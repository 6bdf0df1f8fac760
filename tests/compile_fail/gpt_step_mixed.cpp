// expect: layer_runs_in_half_precision<kiln::nn::Embedding<65, 32
// A GPT has no half-precision path yet (its embeddings and attention are float): a bf16_mixed step
// names the first layer that cannot run in bf16. Control: the fp32 step.
#include <kiln/models/gpt.hpp>
#include <kiln/train.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  using Precision = kiln::precision::fp32;
#else
  using Precision = kiln::precision::bf16_mixed;
#endif
  using Model = kiln::models::GPT<kiln::models::GptConfig{.vocab = 65, .block_size = 16, .layers = 1, .heads = 2, .width = 32}>;
  kiln::CpuExecutor exec;
  Model model;
  kiln::optim::AdamW opt(model, {});
  kiln::train::Step step(model, opt, exec, kiln::policy<Precision>{});
  (void)step;
}

// kiln::train::Step on CUDA: a poisoned gradient is skipped on the device (step_support.hpp).
#include "step_support.hpp"

using namespace kiln_cuda_step_test;

TEST_CASE("Step on CUDA: a poisoned gradient skips the step on the device, parameters bit for bit") {
  const auto data = dataset(16);
  kiln::CudaExecutor exec;
  Mlp::on<Device> model(3);
  kiln::optim::AdamW opt(model, {.lr = 1e-2});
  float* grad = model.parameters()[0].grad;
  bool poison = false;
  kiln::train::Step step(model, opt, exec, kiln::policy<kiln::precision::fp16_mixed>{}, {},
                         {.after_backward = [&](index_t) {
                            if (!poison) return;
                            const float inf = std::numeric_limits<float>::infinity();
                            KILN_CUDA_CHECK(cudaMemcpyAsync(grad + 3, &inf, sizeof(float), cudaMemcpyHostToDevice,
                                                            exec.stream()));
                            KILN_CUDA_CHECK(cudaStreamSynchronize(exec.stream()));
                          }});
  kiln::data::BatchLoader<Device> loader(data, {.batch_size = 16, .shuffle = false, .workers = 0}, exec);
  loader.start_epoch(0);
  step(*loader.next());
  const auto before = values_of(model);
  const float scale = step.scaler().scale();
  poison = true;
  loader.start_epoch(1);
  step(*loader.next());
  CHECK(values_of(model) == before);
  CHECK(step.scaler().scale() == scale / 2);
  poison = false;
  loader.start_epoch(2);
  step(*loader.next());
  CHECK(values_of(model) != before);
}

// A data-parallel job in which the last rank throws in the middle of training, as a bad batch or
// a full disk would make it: the others are then waiting in an all-reduce. dist::fail_job must end
// the whole job with an error (tests/dist/fail_check.sh times it), not leave them blocked.
#include <kiln/dist/process_group.hpp>

#include <cstdio>
#include <vector>

int main() try {
  auto& group = kiln::dist::ProcessGroup::world();
  std::vector<float> gradients(1000, 1.f);
  for (int step = 1; step <= 1000; ++step) {
    if (step == 3 && group.rank() == group.size() - 1)
      throw kiln::DataError("train: batch 3 could not be read (simulated)");
    group.all_reduce(gradients.data(), kiln::index_t(gradients.size()), kiln::dist::ReduceOp::average);
  }
  std::printf("no rank failed\n");
  return 0;
} catch (const std::exception& e) {
  return kiln::dist::fail_job("fail_rank", e);
}

// mode::reduce_overhead on CUDA (kiln/backend/cuda/step_graph.cuh): the step captured as a CUDA
// graph and replayed gives the eager step's parameters bit for bit in fp32 (the same kernels on
// the same buffers) and within rounding in bf16_mixed, with a schedule changing the rate every
// step and the last partial batch captured as a second shape; the allocator makes no cudaMalloc
// after the captures; replays count the launches the eager step counts; dropout (state kept on
// the host) keeps its shape eager and the report says so.
//
// mode::max_autotune on CUDA (kiln/backend/cuda/lt_tuner.cuh): each cuBLASLt plan is timed once
// and trains to the default mode's parameters within fp32 rounding; a second run reads every
// choice from the cache file; a garbled line makes the file untrusted (one warning, rewritten).
#include "step_support.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

using namespace kiln_cuda_step_test;

namespace {

struct Run {
  std::vector<float> params, losses;
  kiln::train::CaptureCounts counts;
  std::size_t mallocs_after_captures = 0, launches_last_step = 0;
  std::string report;
};

template <class Model, class Policy>
Run run(int steps, kiln::train::StepOptions options = {}) {
  kiln::CudaExecutor exec;
  Model model(3);
  kiln::optim::AdamW opt(model, {.lr = 1e-2});
  kiln::train::Step step(model, opt, exec, Policy{}, kiln::train::CrossEntropy{}, options);
  step.set_schedule(kiln::optim::CosineAnnealingLr(1e-2, steps, 1e-4));
  const auto data = dataset(16 * 3 + 5);  // three batches of 16 and a partial one of 5
  kiln::data::BatchLoader<kiln::cuda> loader(data, {.batch_size = 16, .shuffle = false, .workers = 0}, exec);
  Run out;
  std::size_t mallocs = 0;
  int done = 0;
  for (int epoch = 0; done < steps; ++epoch) {
    loader.start_epoch(epoch);
    while (const auto* b = loader.next()) {
      if (done == 8) mallocs = kiln::cu::default_allocator().stats().allocations -
                               kiln::cu::default_allocator().stats().cache_hits;
      const auto before = exec.stats().launches();
      step(*b);
      out.launches_last_step = exec.stats().launches() - before;
      for (float l : step.take_losses()) out.losses.push_back(l);
      if (++done == steps) break;
    }
  }
  exec.synchronize();
  out.mallocs_after_captures = kiln::cu::default_allocator().stats().allocations -
                               kiln::cu::default_allocator().stats().cache_hits - mallocs;
  out.params = values_of(model);
  if constexpr (decltype(step)::captures) out.counts = step.captures_made().counts();
  out.report = step.mode_report();
  return out;
}

using DeviceMlp = Mlp::on<kiln::cuda>;
using DropMlp = nn::Sequential<nn::Linear<12, 32>, nn::ReLU, nn::Dropout<0.25>, nn::Linear<32, 4>>::on<kiln::cuda>;

}  // namespace

TEST_CASE("reduce_overhead on CUDA: replayed graphs give the eager steps' parameters, fp32 bit for bit") {
  const Run eager = run<DeviceMlp, kiln::policy<>>(16);
  const Run replayed = run<DeviceMlp, kiln::policy<kiln::mode::reduce_overhead>>(16);
  CHECK(replayed.params == eager.params);
  CHECK(replayed.losses == eager.losses);
  // Two shapes (16 and 5 rows): a warm-up and a capture each, the rest replayed.
  CHECK(replayed.counts.captured_steps == 2);
  CHECK(replayed.counts.eager_steps == 2);
  CHECK(replayed.counts.replays == 12);
  CHECK(replayed.mallocs_after_captures == 0);
  CHECK(replayed.launches_last_step == eager.launches_last_step);
  MESSAGE(replayed.report);
}

TEST_CASE("reduce_overhead on CUDA: bf16_mixed replays within rounding of eager") {
  const Run eager = run<DeviceMlp, kiln::policy<kiln::precision::bf16_mixed>>(12);
  const Run replayed = run<DeviceMlp, kiln::policy<kiln::precision::bf16_mixed, kiln::mode::reduce_overhead>>(12);
  REQUIRE(eager.params.size() == replayed.params.size());
  double worst = 0;
  for (std::size_t i = 0; i < eager.params.size(); ++i)
    worst = std::max(worst, std::abs(double(eager.params[i]) - double(replayed.params[i])));
  CHECK(worst <= 1e-3);
  CHECK(replayed.counts.replays > 0);
}

TEST_CASE("reduce_overhead on CUDA: dropout keeps its shape eager, and the report names it") {
  const Run r = run<DropMlp, kiln::policy<kiln::mode::reduce_overhead>>(8);
  CHECK(r.counts.replays == 0);
  CHECK(r.report.find("dropout's random offset") != std::string::npos);
}

namespace {

std::string fresh_dir(const char* name) {
  const auto dir = std::filesystem::temp_directory_path() / (std::string("kiln-lt-tune-") + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

// Warnings said while it lives.
struct Warnings {
  std::vector<std::string> said;
  kiln::WarningHandler previous = kiln::set_warning_handler([this](const std::string& m) { said.push_back(m); });
  ~Warnings() { kiln::set_warning_handler(previous); }
};

double worst_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

}  // namespace

TEST_CASE("max_autotune on CUDA: each cuBLASLt plan timed once, trains as default, read back from the cache") {
  const std::string dir = fresh_dir("reuse");
  const kiln::train::StepOptions options{.autotune = {.cache_dir = dir}};
  Warnings w;
  const Run plain = run<DeviceMlp, kiln::policy<>>(8);
  const Run first = run<DeviceMlp, kiln::policy<kiln::mode::max_autotune>>(8, options);
  MESSAGE(first.report);
  CHECK(first.report.find(" timed now, 0 read from the cache") != std::string::npos);
  CHECK(first.report.find("heuristic") != std::string::npos);
  // Another algorithm may sum in another order: fp32 rounding after eight AdamW steps.
  CHECK(worst_difference(first.params, plain.params) <= 2e-4);
  const Run second = run<DeviceMlp, kiln::policy<kiln::mode::max_autotune>>(8, options);
  // A cached plan is reused where the heuristic offers the same algorithm, compared byte for byte
  // (cublasLtMatmulAlgo_t is opaque: that a new handle fills it with the same bytes is what
  // everyone who persists algorithms relies on, but nobody documents) — reported, and at least
  // one plan must come from the cache.
  MESSAGE("observed: the second max_autotune run: " << second.report);
  CHECK(second.report.find("from the cache") != std::string::npos);
  CHECK(second.report.find(" 0 read from the cache") == std::string::npos);
  CHECK(worst_difference(second.params, plain.params) <= 2e-4);
  CHECK(w.said.empty());
  kiln::cu::LtTuner reader({.cache_dir = dir});
  CHECK(reader.loaded() > 0);
}

TEST_CASE("max_autotune on CUDA: a garbled cache line is one warning, and the file is rewritten") {
  const std::string dir = fresh_dir("garbled");
  const kiln::train::StepOptions options{.autotune = {.cache_dir = dir}};
  (void)run<DeviceMlp, kiln::policy<kiln::mode::max_autotune>>(4, options);
  std::string path;
  index_t good_lines = 0;
  {
    kiln::cu::LtTuner reader({.cache_dir = dir});
    path = reader.cache().path();
    good_lines = reader.loaded();
  }
  REQUIRE(good_lines > 0);
  std::ostringstream text;
  text << std::ifstream(path, std::ios::binary).rdbuf();
  std::string body = text.str().substr(0, text.str().rfind("crc32c "));
  body.replace(body.find("\nlt ") + 4, 1, "x");  // the first choice's m is no number now
  char crc[32];
  std::snprintf(crc, sizeof crc, "crc32c %08x\n", unsigned(kiln::io::crc32c(body.data(), body.size())));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << body << crc;
  Warnings w;
  const Run again = run<DeviceMlp, kiln::policy<kiln::mode::max_autotune>>(4, options);
  REQUIRE(w.said.size() == 1);
  CHECK(w.said[0].find("a line does not parse") != std::string::npos);
  CHECK(again.report.find(", 0 read from the cache") != std::string::npos);
  kiln::cu::LtTuner reread({.cache_dir = dir});
  CHECK(reread.loaded() == good_lines);
}

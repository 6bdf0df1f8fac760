// mode::max_autotune on the CPU (kiln/tune/gemm_tuner.hpp, kiln/tune/tune_cache.hpp): every
// candidate the tuner may choose computes the product a naive fp64 loop computes; a run writes
// its choices to the cache and a second run reads them instead of timing; a corrupt, truncated or
// foreign cache file is ignored with one warning and rewritten; a directory that cannot be
// written is one warning and the run goes on; training under max_autotune matches default.
#include <kiln/train.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "step_helpers.hpp"

using namespace kiln;

namespace {

using kiln_step_test::OwnedBatch;
using kiln_step_test::random_batch;
using kiln_step_test::values_of;

using Mlp = nn::Sequential<nn::Linear<12, 48>, nn::ReLU, nn::Linear<48, 300>, nn::ReLU, nn::Linear<300, 4>>;

std::string fresh_dir(const char* name) {
  const auto dir = std::filesystem::temp_directory_path() / (std::string("kiln-autotune-") + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}
void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Warnings said while it lives.
struct Warnings {
  std::vector<std::string> said;
  WarningHandler previous = set_warning_handler([this](const std::string& m) { said.push_back(m); });
  ~Warnings() { set_warning_handler(previous); }
};

// A few training steps under `Policy`, with the tuner's cache in `dir`; the model's parameters
// and the step's mode report.
template <class Policy>
std::pair<std::vector<float>, std::string> train_in(const std::string& dir, int threads = 1) {
  CpuExecutor exec(threads);
  Mlp model(4);
  optim::AdamW opt(model, {.lr = 1e-2});
  train::StepOptions options;
  options.autotune.cache_dir = dir;
  options.autotune.min_rounds = 2;
  options.autotune.budget_ms = 1;
  train::Step step(model, opt, exec, Policy{}, train::CrossEntropy{}, options);
  for (int s = 0; s < 4; ++s) {
    OwnedBatch b = random_batch(s == 3 ? 7 : 20, 60 + std::uint64_t(s));
    step(b.batch());
  }
  (void)step.take_losses();
  return {values_of(model), step.mode_report()};
}

}  // namespace

TEST_CASE("autotune: every candidate plan computes the product (orientations, k blocks, teams)") {
  using cpu::trans;
  std::vector<cpu::gemm_tuning> plans{{},
                                           {.orientation = 1},
                                           {.orientation = 2},
                                           {.kc = 64},
                                           {.kc = 512},
                                           {.team = 1},
                                           {.orientation = 2, .team = 2, .kc = 100}};
  if (cpu::gemm_have_cblas) plans.push_back({.cblas = true});
  Generator g(3);
  for (auto [m, n, k] : {std::array<index_t, 3>{7, 10, 300}, {64, 33, 129}, {5, 200, 1}, {70, 70, 530}}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        std::vector<float> a(std::size_t(m * k)), b(std::size_t(k * n)), c0(std::size_t(m * n));
        for (auto& v : a) v = g.uniform(-1.f, 1.f);
        for (auto& v : b) v = g.uniform(-1.f, 1.f);
        for (auto& v : c0) v = g.uniform(-1.f, 1.f);
        const index_t lda = ta ? m : k, ldb = tb ? k : n;
        // The reference in fp64, and the float rounding bound of each element: k products summed
        // and two scalings, each off by at most 2^-24 of the magnitudes involved.
        std::vector<double> ref(std::size_t(m * n)), bound(std::size_t(m * n));
        for (index_t i = 0; i < m; ++i)
          for (index_t j = 0; j < n; ++j) {
            double s = 0, magnitude = 0;
            for (index_t p = 0; p < k; ++p) {
              const double t = double(ta ? a[std::size_t(p * lda + i)] : a[std::size_t(i * lda + p)]) *
                               double(tb ? b[std::size_t(j * ldb + p)] : b[std::size_t(p * ldb + j)]);
              s += t;
              magnitude += std::abs(t);
            }
            const double c = double(c0[std::size_t(i * n + j)]);
            ref[std::size_t(i * n + j)] = 0.5 * s + 2.0 * c;
            bound[std::size_t(i * n + j)] = double(k + 3) * 0x1p-24 * (0.5 * magnitude + 2.0 * std::abs(c));
          }
        for (const auto& plan : plans) {
          std::vector<float> c = c0;
          cpu::gemm_tuned<float>(ta ? trans::yes : trans::no, tb ? trans::yes : trans::no, m, n, k, 0.5f, a.data(),
                                 lda, b.data(), ldb, 2.0f, c.data(), n, 2, plan);
          double worst = 0;  // the largest error as a share of its element's bound
          for (std::size_t i = 0; i < c.size(); ++i)
            worst = std::max(worst, std::abs(double(c[i]) - ref[i]) / bound[i]);
          CAPTURE(m);
          CAPTURE(n);
          CAPTURE(k);
          CAPTURE(ta);
          CAPTURE(tb);
          CAPTURE(plan.orientation);
          CAPTURE(plan.kc);
          CHECK(worst <= 1.0);
        }
      }
  }
}

TEST_CASE("autotune: the first run times and writes the cache, the second reads it and times nothing") {
  const std::string dir = fresh_dir("reuse");
  Warnings w;
  const auto [p1, report1] = train_in<policy<mode::max_autotune>>(dir);
  CHECK(report1.find(" timed now, 0 read from the cache") != std::string::npos);
  const auto [p2, report2] = train_in<policy<mode::max_autotune>>(dir);
  CHECK(report2.find(" 0 timed now, ") != std::string::npos);
  CHECK(report2.find("from the cache") != std::string::npos);
  CHECK(p1 == p2);  // the same choices
  CHECK(w.said.empty());
  // Two batch shapes (20 and 7 rows): 3 forward, 3 weight-gradient and 2 input-gradient GEMMs each.
  tune::GemmTuner reader({.cache_dir = dir});
  CHECK(reader.cache().loaded() == 16);
}

TEST_CASE("autotune: training under max_autotune reaches default's parameters (within k-blocking rounding)") {
  const auto [tuned, report] = train_in<policy<mode::max_autotune>>(fresh_dir("match"), 2);
  const auto [plain, unused] = train_in<policy<>>(fresh_dir("match-default"), 2);
  REQUIRE(tuned.size() == plain.size());
  double worst = 0;
  for (std::size_t i = 0; i < tuned.size(); ++i) worst = std::max(worst, double(std::abs(tuned[i] - plain[i])));
  CHECK(worst < 1e-5);
  CHECK(report.find("mode max_autotune: 16 GEMM shapes") != std::string::npos);
}

TEST_CASE("autotune: a corrupt, truncated or foreign cache file is ignored with one warning and rewritten") {
  const std::string dir = fresh_dir("bad");
  (void)train_in<policy<mode::max_autotune>>(dir);
  tune::GemmTuner first({.cache_dir = dir});
  const std::string path = first.cache().path();
  const std::string good = read_text(path);
  REQUIRE(good.size() > 100);

  auto check_rejected = [&](const std::string& bad, const char* reason) {
    write_text(path, bad);
    Warnings w;
    const auto [params, report] = train_in<policy<mode::max_autotune>>(dir);
    CAPTURE(reason);
    REQUIRE(w.said.size() == 1);
    CHECK(w.said[0].find(path) != std::string::npos);
    CHECK(w.said[0].find(reason) != std::string::npos);
    CHECK(report.find(", 0 read from the cache") != std::string::npos);
    tune::GemmTuner reread({.cache_dir = dir});  // rewritten: whole and trusted again
    CHECK(reread.cache().loaded() == 16);
  };
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x01;
  check_rejected(flipped, "checksum does not match");
  check_rejected(good.substr(0, good.size() / 2), "no checksum line");
  check_rejected("", "no checksum line");
  // Another machine's file under this name (its checksum is right).
  std::string foreign = good.substr(0, good.rfind("crc32c "));
  foreign.replace(foreign.find("fingerprint cpu=") + 16, 3, "XYZ");
  char crc[32];
  std::snprintf(crc, sizeof crc, "crc32c %08x\n", unsigned(io::crc32c(foreign.data(), foreign.size())));
  check_rejected(foreign + crc, "written for another machine");
  // A line that does not parse, checksum made right.
  std::string garbled = good.substr(0, good.rfind("crc32c "));
  garbled.replace(garbled.find("gemm f32 "), 9, "gemm f32 Q ");
  std::snprintf(crc, sizeof crc, "crc32c %08x\n", unsigned(io::crc32c(garbled.data(), garbled.size())));
  check_rejected(garbled + crc, "a line does not parse");
}

TEST_CASE("autotune: a cache directory that cannot be written is one warning, and tuning goes on") {
  const std::string dir = fresh_dir("unwritable");
  std::filesystem::create_directories(dir);
  write_text(dir + "/file", "not a directory");
  Warnings w;
  const auto [params, report] = train_in<policy<mode::max_autotune>>(dir + "/file/cache");
  REQUIRE(w.said.size() == 1);
  CHECK(w.said[0].find("cannot write the cache") != std::string::npos);
  CHECK(report.find("16 GEMM shapes, 16 timed now") != std::string::npos);
}

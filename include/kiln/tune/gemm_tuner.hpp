// kiln/tune/gemm_tuner.hpp — mode::max_autotune on the CPU: each GEMM shape a step meets is
// timed once over its candidates, the fastest is kept, and the choices go to a cache file a
// later run reads instead of timing again.
//
// Candidates (kiln/backend/cpu/gemm.hpp's gemm_tuning): the heuristics' plan; the other
// orientation (C or C^T on the register tile's long side); k blocks half and twice the kernel's
// kc; one thread or the whole team where the heuristics chose the other; and, when asked
// (GemmTunerOptions::cblas), CBLAS for float and double where the build has one. Each runs on
// private copies of the operands (a product that
// adds onto C must not be run twice on it), interleaved round by round so that a clock change
// hits all alike, and the median decides. A candidate must beat the heuristics' plan by 3% to be
// chosen: timing noise never makes a step slower than default.
//
// The cache (tune/tune_cache.hpp) is one file per machine fingerprint — CPU model, the ISA kiln
// was compiled for, its GEMM microkernel, whether CBLAS is linked, kiln's version — in
// KILN_CACHE_DIR (default $XDG_CACHE_HOME/kiln, else ~/.cache/kiln). A file that is corrupt,
// truncated or written for another fingerprint is ignored with one warning and rewritten; a
// directory that cannot be written is one warning, and tuning goes on without a cache.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/backend/cpu/gemm.hpp"
#include "kiln/core/cpu_model.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/warning.hpp"
#include "kiln/tune/tune_cache.hpp"

namespace kiln::tune {

class GemmTuner final : public cpu::GemmChooser {
 public:
  explicit GemmTuner(GemmTunerOptions options = {}) : cpu::GemmChooser(&choose_any), options_(options) {
    if (!options_.use_cache) return;
    cache_.open(options_.cache_dir.empty() ? default_cache_dir() : options_.cache_dir, fingerprint());
  }

  // The choice for C = alpha op(A) op(B) + beta C of these sizes on `threads`, timed now when
  // neither this run nor the cache has it.
  template <class T>
  const GemmChoice& choose(bool ta, bool tb, index_t m, index_t n, index_t k, int threads) {
    const GemmKey key{type_name<T>(), ta, tb, m, n, k, threads};
    if (GemmChoice* c = cache_.find(key)) {
      if (!c->used && c->from_file) ++reused_;
      c->used = true;
      return *c;
    }
    GemmChoice c = measure<T>(key);
    c.used = true;
    ++tuned_;
    return cache_.insert(key, std::move(c));
  }

  cpu::gemm_tuning choose(cpu::gemm_type type, bool ta, bool tb, index_t m, index_t n, index_t k, int threads) {
    switch (type) {
      case cpu::gemm_type::f32: return choose<float>(ta, tb, m, n, k, threads).tuning;
      case cpu::gemm_type::f64: return choose<double>(ta, tb, m, n, k, threads).tuning;
      case cpu::gemm_type::bf16: return choose<bf16>(ta, tb, m, n, k, threads).tuning;
      case cpu::gemm_type::f16: return choose<f16>(ta, tb, m, n, k, threads).tuning;
    }
    return {};
  }

  // Writes the cache file when this run tuned something new (a warning, not an error, when it
  // cannot).
  void save() { cache_.save(); }

  index_t tuned() const { return tuned_; }    // shapes timed by this tuner
  index_t reused() const { return reused_; }  // shapes found in the cache file
  const TuneCache& cache() const { return cache_; }
  // One line per shape this run used: its choice, and its time against the heuristics'.
  std::string report() const { return cache_.report(); }

  static std::string fingerprint() {
    return "cpu=" + kiln::cpu_model() + "; isa=" + kiln::targeted_extensions() + "; kernel=" + kernel_name() + "; cblas=" +
           (cpu::gemm_have_cblas ? "yes" : "no") + "; kiln=" + kiln::version;
  }

 private:
  // What an executor calls (cpu::GemmChooser).
  static cpu::gemm_tuning choose_any(cpu::GemmChooser* self, cpu::gemm_type type, bool ta, bool tb, index_t m,
                                     index_t n, index_t k, int threads) {
    return static_cast<GemmTuner*>(self)->choose(type, ta, tb, m, n, k, threads);
  }

  template <class T>
  static const char* type_name() {
    if constexpr (std::is_same_v<T, float>) return "f32";
    else if constexpr (std::is_same_v<T, double>) return "f64";
    else if constexpr (std::is_same_v<T, bf16>) return "bf16";
    else return "f16";
  }
  static const char* kernel_name() {
#if KILN_GEMM_AVX512
    return "avx512-12x32";
#elif KILN_GEMM_AVX2
    return "avx2-6x16";
#else
    return "portable";
#endif
  }

  struct Candidate {
    std::string label;
    cpu::gemm_tuning tuning;
  };

  template <class T>
  std::vector<Candidate> candidates(const GemmKey& key) const {
    const auto facts = cpu::gemm_facts<T>(key.m, key.n);
    std::vector<Candidate> out{{"heuristic", {}}};
    out.push_back({facts.prefers_transposed ? "as given" : "transposed", {.orientation = facts.prefers_transposed ? 1 : 2}});
    const index_t half = std::max(facts.kstep, facts.kc / 2 / facts.kstep * facts.kstep);
    if (key.k > half) out.push_back({"kc " + std::to_string(half), {.kc = half}});
    if (key.k > facts.kc) out.push_back({"kc " + std::to_string(2 * facts.kc), {.kc = 2 * facts.kc}});
    if (key.threads != 1) {
      const int all = key.threads > 0 ? key.threads : cpu::detail::gemm_team_size(0, 1 << 20, 1, 1);
      if (all > 1) {
        out.push_back({"1 thread", {.team = 1}});
        out.push_back({std::to_string(all) + " threads", {.team = all}});
      }
    }
    if constexpr (cpu::gemm_have_cblas && std::is_same_v<T, cpu::gemm_acc_t<T>>)
      if (options_.cblas) out.push_back({"cblas", {.cblas = true}});
    return out;
  }

  template <class T>
  GemmChoice measure(const GemmKey& key) const {
    using Acc = cpu::gemm_acc_t<T>;
    const index_t m = key.m, n = key.n, k = key.k;
    // Private operands, tightly packed; values that keep sums finite.
    std::vector<T> a(std::size_t(std::max<index_t>(m * k, 1))), b(std::size_t(std::max<index_t>(k * n, 1)));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = T(float((i * 7) % 13) / 13.f - 0.5f);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = T(float((i * 5) % 11) / 11.f - 0.5f);
    std::vector<Acc> c(std::size_t(std::max<index_t>(m * n, 1)));
    const index_t lda = key.ta ? m : k, ldb = key.tb ? k : n;
    const auto ta = key.ta ? cpu::trans::yes : cpu::trans::no, tb = key.tb ? cpu::trans::yes : cpu::trans::no;
    const std::vector<Candidate> cands = candidates<T>(key);
    auto run = [&](const Candidate& cand) {
      const auto t0 = std::chrono::steady_clock::now();
      cpu::gemm_tuned<T>(ta, tb, m, n, k, Acc(1), a.data(), lda, b.data(), ldb, Acc(0), c.data(), n, key.threads,
                         cand.tuning);
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    };
    for (const Candidate& cand : cands) run(cand);  // warm: packing buffers, caches, CBLAS's threads
    std::vector<std::vector<double>> times(cands.size());
    double spent_us = 0;
    for (int r = 0; r < options_.max_rounds && (r < options_.min_rounds || spent_us < options_.budget_ms * 1e3); ++r)
      for (std::size_t i = 0; i < cands.size(); ++i) {
        times[i].push_back(run(cands[i]));
        spent_us += times[i].back();
      }
    std::vector<double> median(cands.size());
    for (std::size_t i = 0; i < cands.size(); ++i) {
      std::sort(times[i].begin(), times[i].end());
      median[i] = times[i][times[i].size() / 2];
    }
    std::size_t best = 0;
    for (std::size_t i = 1; i < cands.size(); ++i)
      if (median[i] < median[best]) best = i;
    if (median[best] > (1.0 - options_.margin) * median[0]) best = 0;
    GemmChoice out;
    out.label = cands[best].label;
    out.tuning = cands[best].tuning;
    out.tuned_us = median[best];
    out.heuristic_us = median[0];
    out.candidates = index_t(cands.size());
    return out;
  }

  GemmTunerOptions options_;
  TuneCache cache_;
  index_t tuned_ = 0, reused_ = 0;
};

}  // namespace kiln::tune

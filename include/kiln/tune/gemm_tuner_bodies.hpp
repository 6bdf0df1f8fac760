// kiln/tune/gemm_tuner_bodies.hpp — the bodies of gemm_tuner.hpp's functions: included by it when
// kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
// The member templates candidates<T> and measure<T> live here too: only measure_any reaches them,
// so a program that links kiln::kernels compiles none of the timing code.
#pragma once

#include "kiln/tune/gemm_tuner.hpp"

namespace kiln::tune {

KILN_COMPILED GemmTuner::GemmTuner(GemmTunerOptions options) : cpu::GemmChooser(&choose_any), options_(options) {
  if (!options_.use_cache) return;
  cache_.open(options_.cache_dir.empty() ? default_cache_dir() : options_.cache_dir, fingerprint());
}

KILN_COMPILED cpu::gemm_tuning GemmTuner::choose(cpu::gemm_type type, bool ta, bool tb, index_t m, index_t n,
                                                 index_t k, int threads) {
  switch (type) {
    case cpu::gemm_type::f32:
    case cpu::gemm_type::f64:
    case cpu::gemm_type::bf16:
    case cpu::gemm_type::f16: return find_or_measure(type, ta, tb, m, n, k, threads).tuning;
  }
  return {};  // not an element type (no executor passes one): the heuristics' plan, untimed
}

KILN_COMPILED std::string GemmTuner::fingerprint() {
  return "cpu=" + kiln::cpu_model() + "; isa=" + kiln::targeted_extensions() + "; kernel=" + kernel_name() +
         "; cblas=" + (cpu::gemm_have_cblas ? "yes" : "no") + "; kiln=" + kiln::version;
}

KILN_COMPILED cpu::gemm_tuning GemmTuner::choose_any(cpu::GemmChooser* self, cpu::gemm_type type, bool ta, bool tb,
                                                     index_t m, index_t n, index_t k, int threads) {
  return static_cast<GemmTuner*>(self)->choose(type, ta, tb, m, n, k, threads);
}

KILN_COMPILED const GemmChoice& GemmTuner::find_or_measure(cpu::gemm_type type, bool ta, bool tb, index_t m,
                                                           index_t n, index_t k, int threads) {
  const GemmKey key{type_name(type), ta, tb, m, n, k, threads};
  if (GemmChoice* c = cache_.find(key)) {
    if (!c->used && c->from_file) ++reused_;
    c->used = true;
    return *c;
  }
  GemmChoice c = measure_any(type, key);
  c.used = true;
  ++tuned_;
  return cache_.insert(key, std::move(c));
}

KILN_COMPILED const char* GemmTuner::type_name(cpu::gemm_type type) {
  switch (type) {
    case cpu::gemm_type::f32: return "f32";
    case cpu::gemm_type::f64: return "f64";
    case cpu::gemm_type::bf16: return "bf16";
    case cpu::gemm_type::f16: break;
  }
  return "f16";
}

KILN_COMPILED const char* GemmTuner::kernel_name() {
#if KILN_GEMM_AVX512
  return "avx512-12x32";
#elif KILN_GEMM_AVX2
  return "avx2-6x16";
#else
  return "portable";
#endif
}

template <class T>
std::vector<GemmTuner::Candidate> GemmTuner::candidates(const GemmKey& key) const {
  const auto facts = cpu::gemm_facts<T>(key.m, key.n);
  std::vector<Candidate> out{{"heuristic", {}}};
  out.push_back({facts.prefers_transposed ? "as given" : "transposed",
                 {.orientation = facts.prefers_transposed ? 1 : 2}});
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
GemmChoice GemmTuner::measure(const GemmKey& key) const {
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

KILN_COMPILED GemmChoice GemmTuner::measure_any(cpu::gemm_type type, const GemmKey& key) const {
  switch (type) {
    case cpu::gemm_type::f32: return measure<float>(key);
    case cpu::gemm_type::f64: return measure<double>(key);
    case cpu::gemm_type::bf16: return measure<bf16>(key);
    case cpu::gemm_type::f16: break;
  }
  return measure<f16>(key);
}

}  // namespace kiln::tune

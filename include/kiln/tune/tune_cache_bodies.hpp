// kiln/tune/tune_cache_bodies.hpp — the bodies of tune_cache.hpp's functions: included by it when
// kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/tune/tune_cache.hpp"

namespace kiln::tune {

KILN_COMPILED void TuneCache::open(const std::string& dir, const std::string& fingerprint) {
  std::deque<std::pair<GemmKey, GemmChoice>> read;
  std::string why;
  for (const std::string& line : file_.open(dir, "gemm", fingerprint)) {
    if (!parse(line, read, why)) {
      file_.reject(why);
      return;
    }
  }
  entries_ = std::move(read);
  loaded_ = index_t(entries_.size());
}

KILN_COMPILED GemmChoice* TuneCache::find(const GemmKey& key) {
  for (auto& [k, c] : entries_)
    if (k == key) return &c;
  return nullptr;
}

KILN_COMPILED GemmChoice& TuneCache::insert(const GemmKey& key, GemmChoice choice) {
  file_.changed();
  entries_.emplace_back(key, std::move(choice));
  return entries_.back().second;
}

KILN_COMPILED void TuneCache::save() {
  std::vector<std::string> lines;
  for (const auto& [k, c] : entries_) {
    char line[512];
    std::snprintf(line, sizeof line, "gemm %s %c %c %lld %lld %lld %d | %d %d %lld %d | %.3f %.3f %lld | %s",
                  k.type.c_str(), k.ta ? 'T' : 'N', k.tb ? 'T' : 'N', (long long)k.m, (long long)k.n,
                  (long long)k.k, k.threads, c.tuning.orientation, c.tuning.team, (long long)c.tuning.kc,
                  c.tuning.cblas ? 1 : 0, c.tuned_us, c.heuristic_us, (long long)c.candidates, c.label.c_str());
    lines.push_back(line);
  }
  file_.save(lines);
}

KILN_COMPILED std::string TuneCache::report() const {
  std::string out;
  for (const auto& [k, c] : entries_) {
    if (!c.used) continue;
    char line[256];
    std::snprintf(line, sizeof line,
                  "  gemm %s %c%c [%lld x %lld x %lld], %d thread%s: %s %.1f us (heuristic %.1f us, %.2fx), %s\n",
                  k.type.c_str(), k.ta ? 'T' : 'N', k.tb ? 'T' : 'N', (long long)k.m, (long long)k.n,
                  (long long)k.k, k.threads, k.threads == 1 ? "" : "s", c.label.c_str(), c.tuned_us, c.heuristic_us,
                  c.tuned_us > 0 ? c.heuristic_us / c.tuned_us : 1.0, c.from_file ? "from the cache" : "timed now");
    out += line;
  }
  return out;
}

KILN_COMPILED bool TuneCache::parse(const std::string& line, std::deque<std::pair<GemmKey, GemmChoice>>& out,
                                   std::string& why) {
  GemmKey k;
  GemmChoice c;
  char type[8] = {}, ta = 0, tb = 0;
  long long m = 0, n = 0, kk = 0, kc = 0, cands = 0;
  int cblas = 0, consumed = 0;
  if (std::sscanf(line.c_str(), "gemm %7s %c %c %lld %lld %lld %d | %d %d %lld %d | %lf %lf %lld | %n", type, &ta,
                  &tb, &m, &n, &kk, &k.threads, &c.tuning.orientation, &c.tuning.team, &kc, &cblas, &c.tuned_us,
                  &c.heuristic_us, &cands, &consumed) != 14 ||
      consumed == 0 || (ta != 'N' && ta != 'T') || (tb != 'N' && tb != 'T') || m < 0 || n < 0 || kk < 0 ||
      kc < 0 || c.tuning.orientation < 0 || c.tuning.orientation > 2 || c.tuning.team < 0 ||
      (cblas != 0 && cblas != 1) || (cblas == 1 && !cpu::gemm_have_cblas)) {
    why = "a line does not parse: \"" + line.substr(0, 80) + "\"";
    return false;
  }
  k.type = type;
  k.ta = ta == 'T';
  k.tb = tb == 'T';
  k.m = m;
  k.n = n;
  k.k = kk;
  c.tuning.kc = kc;
  c.tuning.cblas = cblas == 1;
  c.candidates = cands;
  c.label = line.substr(std::size_t(consumed));
  c.from_file = true;
  out.emplace_back(std::move(k), std::move(c));
  return true;
}

}  // namespace kiln::tune

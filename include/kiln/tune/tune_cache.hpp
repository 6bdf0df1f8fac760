// kiln/tune/tune_cache.hpp — the CPU GEMM autotuner's choices (kiln/tune/gemm_tuner.hpp), kept
// between runs in a tune file (kiln/tune/tune_file.hpp) of kind "gemm":
//   gemm f32 N T 64 256 400 1 | 2 0 0 0 | 41.2 52.9 5 | transposed
//   ...                        (type, transposes, m n k, threads | orientation team kc cblas |
//                               tuned and heuristic microseconds, candidates | label)
// A line that does not parse makes the whole file untrusted (one warning; it is rewritten).
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backend/cpu/gemm.hpp"
#include "kiln/tune/tune_file.hpp"

namespace kiln::tune {

struct GemmKey {
  std::string type;  // f32, f64, f16, bf16
  bool ta = false, tb = false;
  index_t m = 0, n = 0, k = 0;
  int threads = 1;
  bool operator==(const GemmKey&) const = default;
};

struct GemmChoice {
  std::string label;  // "heuristic", "transposed", "kc 128", "1 thread", "cblas", ...
  cpu::gemm_tuning tuning;
  double tuned_us = 0, heuristic_us = 0;  // medians when it was timed
  index_t candidates = 0;
  bool from_file = false;  // read from the cache file, not timed by this run
  bool used = false;       // a GEMM of this run asked for it
};

class TuneCache {
 public:
  // Reads the file of this fingerprint in `dir`, if there is one (see the header comment).
  void open(const std::string& dir, const std::string& fingerprint) {
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

  GemmChoice* find(const GemmKey& key) {
    for (auto& [k, c] : entries_)
      if (k == key) return &c;
    return nullptr;
  }
  GemmChoice& insert(const GemmKey& key, GemmChoice choice) {
    file_.changed();
    entries_.emplace_back(key, std::move(choice));
    return entries_.back().second;
  }

  // Writes the file when something changed (a warning, not an error, when it cannot).
  void save() {
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

  const std::string& path() const { return file_.path(); }
  index_t loaded() const { return loaded_; }  // choices read from the file
  const std::deque<std::pair<GemmKey, GemmChoice>>& entries() const { return entries_; }

  // "  gemm f32 NT [64 x 256 x 400], 1 thread: transposed 41.2 us (heuristic 52.9 us, 1.28x), timed"
  std::string report() const {
    std::string out;
    for (const auto& [k, c] : entries_) {
      if (!c.used) continue;
      char line[256];
      std::snprintf(line, sizeof line, "  gemm %s %c%c [%lld x %lld x %lld], %d thread%s: %s %.1f us (heuristic %.1f us, %.2fx), %s\n",
                    k.type.c_str(), k.ta ? 'T' : 'N', k.tb ? 'T' : 'N', (long long)k.m, (long long)k.n,
                    (long long)k.k, k.threads, k.threads == 1 ? "" : "s", c.label.c_str(), c.tuned_us, c.heuristic_us,
                    c.tuned_us > 0 ? c.heuristic_us / c.tuned_us : 1.0, c.from_file ? "from the cache" : "timed now");
      out += line;
    }
    return out;
  }

 private:
  static bool parse(const std::string& line, std::deque<std::pair<GemmKey, GemmChoice>>& out, std::string& why) {
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

  TuneFile file_;
  std::deque<std::pair<GemmKey, GemmChoice>> entries_;
  index_t loaded_ = 0;
};

}  // namespace kiln::tune

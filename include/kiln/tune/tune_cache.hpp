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
#include "kiln/config.hpp"
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
  KILN_COMPILED void open(const std::string& dir, const std::string& fingerprint);

  KILN_COMPILED GemmChoice* find(const GemmKey& key);
  KILN_COMPILED GemmChoice& insert(const GemmKey& key, GemmChoice choice);

  // Writes the file when something changed (a warning, not an error, when it cannot).
  KILN_COMPILED void save();

  const std::string& path() const { return file_.path(); }
  index_t loaded() const { return loaded_; }  // choices read from the file
  const std::deque<std::pair<GemmKey, GemmChoice>>& entries() const { return entries_; }

  // "  gemm f32 NT [64 x 256 x 400], 1 thread: transposed 41.2 us (heuristic 52.9 us, 1.28x), timed"
  KILN_COMPILED std::string report() const;

 private:
  KILN_COMPILED static bool parse(const std::string& line, std::deque<std::pair<GemmKey, GemmChoice>>& out,
                                  std::string& why);

  TuneFile file_;
  std::deque<std::pair<GemmKey, GemmChoice>> entries_;
  index_t loaded_ = 0;
};

}  // namespace kiln::tune

#if KILN_HEADER_BODIES
#include "kiln/tune/tune_cache_bodies.hpp"
#endif

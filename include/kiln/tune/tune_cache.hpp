// kiln/tune/tune_cache.hpp — the autotuner's choices (kiln/tune/gemm_tuner.hpp) and the file that
// keeps them between runs.
//
// One text file per machine fingerprint, <dir>/gemm-<crc32c of the fingerprint>.kiln-tune:
//   kiln-autotune 1
//   fingerprint cpu=...; isa=...; kernel=...; cblas=...; kiln=0.1.0
//   gemm f32 N T 64 256 400 1 | 2 0 0 0 | 41.2 52.9 5 | transposed
//   ...                        (type, transposes, m n k, threads | orientation team kc cblas |
//                               tuned and heuristic microseconds, candidates | label)
//   crc32c 1a2b3c4d            (of every byte before this line)
// Read strictly: a bad checksum, a line that does not parse, a truncated file or another
// fingerprint makes the whole file untrusted — one warning, the file is ignored and rewritten.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include <sys/stat.h>

#include "kiln/backend/cpu/gemm.hpp"
#include "kiln/core/cpu_model.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/warning.hpp"
#include "kiln/io/atomic_file.hpp"
#include "kiln/io/crc32c.hpp"

namespace kiln {

// kiln's version, as CMake's project() says it; part of every cache fingerprint.
inline constexpr const char* version = "0.1.0";

namespace tune {

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

// The user's cache directory for kiln: KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else
// ~/.cache/kiln (empty when none of these is set).
inline std::string default_cache_dir() {
  if (const char* d = std::getenv("KILN_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/kiln";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kiln";
  return {};
}


class TuneCache {
 public:
  // Reads the file of this fingerprint in `dir`, if there is one (see the header comment).
  void open(const std::string& dir, const std::string& fingerprint) {
    fingerprint_ = fingerprint;
    if (dir.empty()) {
      warn("autotune: no cache directory (KILN_CACHE_DIR, XDG_CACHE_HOME and HOME are unset); tuning without a cache");
      return;
    }
    dir_ = dir;
    char name[32];
    std::snprintf(name, sizeof name, "gemm-%08x.kiln-tune",
                  unsigned(io::crc32c(fingerprint.data(), fingerprint.size())));
    path_ = dir + "/" + name;
    std::ifstream in(path_, std::ios::binary);
    if (!in) return;  // nothing cached yet
    std::ostringstream text;
    text << in.rdbuf();
    std::string why;
    std::deque<std::pair<GemmKey, GemmChoice>> read;
    if (!parse(text.str(), read, why)) {
      warn("autotune: ignoring the cache file " + path_ + ": " + why + "; it will be rewritten");
      dirty_ = true;
      return;
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
    dirty_ = true;
    entries_.emplace_back(key, std::move(choice));
    return entries_.back().second;
  }

  // Writes the file when something changed; a directory that cannot be made or written is one
  // warning, and the run goes on without a cache.
  void save() {
    if (!dirty_ || path_.empty() || failed_) return;
    dirty_ = false;
    try {
      make_directories(dir_);
      const std::string text = serialise();
      io::write_file_atomically(path_, {reinterpret_cast<const unsigned char*>(text.data()), text.size()});
    } catch (const std::exception& e) {
      failed_ = true;
      warn(std::string("autotune: cannot write the cache (") + e.what() + "); going on without one");
    }
  }

  const std::string& path() const { return path_; }
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
  std::string serialise() const {
    std::string out = "kiln-autotune 1\nfingerprint " + fingerprint_ + "\n";
    for (const auto& [k, c] : entries_) {
      char line[512];
      std::snprintf(line, sizeof line, "gemm %s %c %c %lld %lld %lld %d | %d %d %lld %d | %.3f %.3f %lld | %s\n",
                    k.type.c_str(), k.ta ? 'T' : 'N', k.tb ? 'T' : 'N', (long long)k.m, (long long)k.n,
                    (long long)k.k, k.threads, c.tuning.orientation, c.tuning.team, (long long)c.tuning.kc,
                    c.tuning.cblas ? 1 : 0, c.tuned_us, c.heuristic_us, (long long)c.candidates, c.label.c_str());
      out += line;
    }
    char tail[32];
    std::snprintf(tail, sizeof tail, "crc32c %08x\n", unsigned(io::crc32c(out.data(), out.size())));
    return out + tail;
  }

  bool parse(const std::string& text, std::deque<std::pair<GemmKey, GemmChoice>>& out, std::string& why) const {
    const std::size_t crc_at = text.rfind("crc32c ");
    if (crc_at == std::string::npos || (crc_at > 0 && text[crc_at - 1] != '\n')) {
      why = "it has no checksum line (truncated?)";
      return false;
    }
    unsigned stored = 0;
    char end = 0;
    if (std::sscanf(text.c_str() + crc_at, "crc32c %8x%c", &stored, &end) != 2 || end != '\n' ||
        crc_at + 16 != text.size()) {
      why = "its checksum line does not parse";
      return false;
    }
    if (unsigned(io::crc32c(text.data(), crc_at)) != stored) {
      why = "its checksum does not match its contents (corrupt)";
      return false;
    }
    std::istringstream lines(text.substr(0, crc_at));
    std::string line;
    if (!std::getline(lines, line) || line != "kiln-autotune 1") {
      why = "it is not a kiln autotune file of version 1";
      return false;
    }
    if (!std::getline(lines, line) || line != "fingerprint " + fingerprint_) {
      why = "it was written for another machine or build (" + line + ")";
      return false;
    }
    while (std::getline(lines, line)) {
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
    }
    return true;
  }

  static void make_directories(const std::string& dir) {
    for (std::size_t at = 1; at <= dir.size(); ++at) {
      if (at != dir.size() && dir[at] != '/') continue;
      const std::string part = dir.substr(0, at);
      if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
        throw DataError(kiln::detail::concat("cannot create the directory ", part, ": ", std::strerror(errno)));
    }
  }

  std::string fingerprint_, dir_, path_;
  std::deque<std::pair<GemmKey, GemmChoice>> entries_;
  index_t loaded_ = 0;
  bool dirty_ = false, failed_ = false;
};

}  // namespace tune
}  // namespace kiln

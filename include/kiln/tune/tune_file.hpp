// kiln/tune/tune_file.hpp — the file an autotuner keeps its choices in between runs (the CPU's
// GEMM tuner, kiln/tune/tune_cache.hpp; cuBLASLt's, kiln/backend/cuda/lt_tuner.cuh).
//
// One text file per kind and fingerprint, <dir>/<kind>-<crc32c of the fingerprint>.kiln-tune:
//   kiln-autotune 1
//   fingerprint <what the choices depend on: machine, libraries, kiln's version>
//   <one line per choice, in the tuner's own format>
//   crc32c 1a2b3c4d            (of every byte before this line)
// Read strictly: a bad checksum, a truncated file or another fingerprint makes the whole file
// untrusted — one warning, the file is ignored and rewritten. The tuner parses the lines and
// rejects the file the same way when one does not parse. Written atomically (a crash leaves the
// old file or the new one, never half of one).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "kiln/core/error.hpp"
#include "kiln/core/warning.hpp"
#include "kiln/io/atomic_file.hpp"
#include "kiln/io/crc32c.hpp"

namespace kiln {

// kiln's version, as CMake's project() says it; part of every cache fingerprint.
inline constexpr const char* version = "0.1.0";

namespace tune {

// The user's cache directory for kiln: KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else
// ~/.cache/kiln (empty when none of these is set).
inline std::string default_cache_dir() {
  if (const char* d = std::getenv("KILN_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/kiln";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kiln";
  return {};
}

// What a GEMM autotuner (the CPU's, kiln/tune/gemm_tuner.hpp; cuBLASLt's on CUDA) does.
struct GemmTunerOptions {
  // Where the cache lives; empty: KILN_CACHE_DIR, else the user's cache directory (above).
  std::string cache_dir = {};
  bool use_cache = true;  // false: time every shape, read and write no file
  // Timing rounds per shape: at least min_rounds, more while under budget_ms in all.
  int min_rounds = 5, max_rounds = 40;
  double budget_ms = 30;
  double margin = 0.03;  // a candidate must beat the heuristics' plan by this share
  // Time CBLAS too (float / double, where the build has one). Off by default: OpenBLAS keeps a
  // pool of threads that, once woken, compete with the rest of the step for the cores — a cost a
  // per-GEMM timing cannot see. On the 2-core development machine the MLP step at batch 256 ran
  // 2-4% slower with CBLAS chosen for its two smallest GEMMs (bench/policies --only modes), and at
  // parity with OPENBLAS_NUM_THREADS=1.
  bool cblas = false;
  // On CUDA (kiln/backend/cuda/lt_tuner.cuh): how many of cuBLASLt's heuristic algorithms to time.
  int lt_candidates = 8;
};

class TuneFile {
 public:
  // The body lines of <dir>/<kind>-<crc>.kiln-tune when the file exists and is trusted; none
  // (after one warning) when it is not. An empty `dir` is one warning: tuning without a cache.
  std::vector<std::string> open(const std::string& dir, const std::string& kind, const std::string& fingerprint) {
    fingerprint_ = fingerprint;
    if (dir.empty()) {
      warn("autotune: no cache directory (KILN_CACHE_DIR, XDG_CACHE_HOME and HOME are unset); tuning without a cache");
      return {};
    }
    dir_ = dir;
    char name[64];
    std::snprintf(name, sizeof name, "%s-%08x.kiln-tune", kind.c_str(),
                  unsigned(io::crc32c(fingerprint.data(), fingerprint.size())));
    path_ = dir + "/" + name;
    std::ifstream in(path_, std::ios::binary);
    if (!in) return {};  // nothing cached yet
    std::ostringstream text;
    text << in.rdbuf();
    std::string why;
    std::vector<std::string> lines;
    if (!parse(text.str(), lines, why)) {
      reject(why);
      return {};
    }
    return lines;
  }

  // The tuner found a line it cannot trust: one warning, and the file is rewritten at save().
  void reject(const std::string& why) {
    warn("autotune: ignoring the cache file " + path_ + ": " + why + "; it will be rewritten");
    dirty_ = true;
  }
  void changed() { dirty_ = true; }

  // Writes `lines` when something changed; a directory that cannot be made or written is one
  // warning, and the run goes on without a cache.
  void save(const std::vector<std::string>& lines) {
    if (!dirty_ || path_.empty() || failed_) return;
    dirty_ = false;
    try {
      make_directories(dir_);
      std::string text = "kiln-autotune 1\nfingerprint " + fingerprint_ + "\n";
      for (const std::string& line : lines) text += line + "\n";
      char tail[32];
      std::snprintf(tail, sizeof tail, "crc32c %08x\n", unsigned(io::crc32c(text.data(), text.size())));
      text += tail;
      io::write_file_atomically(path_, {reinterpret_cast<const unsigned char*>(text.data()), text.size()});
    } catch (const std::exception& e) {
      failed_ = true;
      warn(std::string("autotune: cannot write the cache (") + e.what() + "); going on without one");
    }
  }

  const std::string& path() const { return path_; }

 private:
  bool parse(const std::string& text, std::vector<std::string>& out, std::string& why) const {
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
    while (std::getline(lines, line)) out.push_back(line);
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
  bool dirty_ = false, failed_ = false;
};

}  // namespace tune
}  // namespace kiln

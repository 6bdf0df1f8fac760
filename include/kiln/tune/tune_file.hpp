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

#include "kiln/config.hpp"
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
KILN_COMPILED std::string default_cache_dir();

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
  KILN_COMPILED std::vector<std::string> open(const std::string& dir, const std::string& kind,
                                              const std::string& fingerprint);

  // The tuner found a line it cannot trust: one warning, and the file is rewritten at save().
  KILN_COMPILED void reject(const std::string& why);
  void changed() { dirty_ = true; }

  // Writes `lines` when something changed; a directory that cannot be made or written is one
  // warning, and the run goes on without a cache.
  KILN_COMPILED void save(const std::vector<std::string>& lines);

  const std::string& path() const { return path_; }

 private:
  KILN_COMPILED bool parse(const std::string& text, std::vector<std::string>& out, std::string& why) const;
  KILN_COMPILED static void make_directories(const std::string& dir);

  std::string fingerprint_, dir_, path_;
  bool dirty_ = false, failed_ = false;
};

}  // namespace tune
}  // namespace kiln

#if KILN_HEADER_BODIES
#include "kiln/tune/tune_file_bodies.hpp"
#endif

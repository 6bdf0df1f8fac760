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
#include "kiln/config.hpp"
#include "kiln/core/cpu_model.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/warning.hpp"
#include "kiln/tune/tune_cache.hpp"

namespace kiln::tune {

class GemmTuner final : public cpu::GemmChooser {
 public:
  KILN_COMPILED explicit GemmTuner(GemmTunerOptions options = {});

  // The choice for C = alpha op(A) op(B) + beta C of these sizes on `threads`, timed now when
  // neither this run nor the cache has it.
  template <class T>
  const GemmChoice& choose(bool ta, bool tb, index_t m, index_t n, index_t k, int threads) {
    return find_or_measure(cpu::gemm_type_of<T>, ta, tb, m, n, k, threads);
  }

  KILN_COMPILED cpu::gemm_tuning choose(cpu::gemm_type type, bool ta, bool tb, index_t m, index_t n, index_t k,
                                        int threads);

  // Writes the cache file when this run tuned something new (a warning, not an error, when it
  // cannot).
  void save() { cache_.save(); }

  index_t tuned() const { return tuned_; }    // shapes timed by this tuner
  index_t reused() const { return reused_; }  // shapes found in the cache file
  const TuneCache& cache() const { return cache_; }
  // One line per shape this run used: its choice, and its time against the heuristics'.
  std::string report() const { return cache_.report(); }

  KILN_COMPILED static std::string fingerprint();

 private:
  // What an executor calls (cpu::GemmChooser).
  KILN_COMPILED static cpu::gemm_tuning choose_any(cpu::GemmChooser* self, cpu::gemm_type type, bool ta, bool tb,
                                                   index_t m, index_t n, index_t k, int threads);

  // Both choose()s' work, for the element type `type`: untyped, so that a program compiles none of
  // the timing code (measure<T> is reached through measure_any only, in gemm_tuner_bodies.hpp).
  KILN_COMPILED const GemmChoice& find_or_measure(cpu::gemm_type type, bool ta, bool tb, index_t m, index_t n,
                                                  index_t k, int threads);
  KILN_COMPILED static const char* type_name(cpu::gemm_type type);
  KILN_COMPILED static const char* kernel_name();

  struct Candidate {
    std::string label;
    cpu::gemm_tuning tuning;
  };

  // Defined in the bodies (gemm_tuner_bodies.hpp), instantiated there for the four element types.
  template <class T>
  std::vector<Candidate> candidates(const GemmKey& key) const;
  template <class T>
  GemmChoice measure(const GemmKey& key) const;
  KILN_COMPILED GemmChoice measure_any(cpu::gemm_type type, const GemmKey& key) const;

  GemmTunerOptions options_;
  TuneCache cache_;
  index_t tuned_ = 0, reused_ = 0;
};

}  // namespace kiln::tune

#if KILN_HEADER_BODIES
#include "kiln/tune/gemm_tuner_bodies.hpp"
#endif

// kiln/backend/cuda/lt_tuner.cuh — mode::max_autotune on CUDA: for each new cuBLASLt plan (a
// GEMM shape, its types, epilogue, leading dimensions and alignments) the tuner times the
// heuristic's top algorithms (GemmTunerOptions::lt_candidates, 8 by default) and keeps the
// fastest, and a cache file keeps the choice for later runs.
//
// Timing runs each candidate on private operands of the same sizes and alignments (a GEMM that
// accumulates into D, or writes a bias gradient, must not run twice on the real ones), filled with
// a finite non-zero byte pattern, interleaved round by round, with CUDA events around a burst of
// calls long enough (about 50 us) that the event resolution does not decide. The median decides,
// and a candidate must beat the heuristic's first choice by GemmTunerOptions::margin (3%): noise
// never makes a step slower than default. A candidate cuBLASLt refuses to run is skipped.
//
// Cache: a tune file (kiln/tune/tune_file.hpp) of kind "cublaslt" per fingerprint — the device's
// name and compute capability, the cuBLASLt and CUDA runtime versions, kiln's version. A line
// keeps the plan key, the chosen algorithm's index among the heuristic's and its opaque
// cublasLtMatmulAlgo_t (cuBLASLt documents it as serialisable for the same library version); a
// cached choice is used only when the heuristic still offers that very algorithm at that index,
// and is timed again otherwise.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/cublaslt.cuh"
#include "kiln/tune/tune_file.hpp"

namespace kiln::cu {

struct LtTunedChoice {
  int index = 0;  // among the heuristic's algorithms, best first
  cublasLtMatmulAlgo_t algo{};
  double tuned_us = 0, heuristic_us = 0;  // medians when it was timed
  int candidates = 0;
  bool from_file = false;  // read from the cache file, not timed by this run
  bool used = false;       // a GEMM of this run asked for it
};

class LtTuner final : public LtAlgoChooser {
 public:
  explicit LtTuner(tune::GemmTunerOptions options = {}) : options_(options) {
    if (!options_.use_cache) return;
    std::string why;
    for (const std::string& line :
         file_.open(options_.cache_dir.empty() ? tune::default_cache_dir() : options_.cache_dir, "cublaslt",
                    fingerprint())) {
      if (!parse(line, why)) {
        file_.reject(why);
        entries_.clear();
        break;
      }
    }
    loaded_ = index_t(entries_.size());
  }

  int candidates() const override { return std::max(1, options_.lt_candidates); }

  int choose(const LtChoiceRequest& r) override {
    for (auto& [key, c] : entries_) {
      if (key != r.key) continue;
      if (c.index < r.count && std::memcmp(&r.found[c.index].algo, &c.algo, sizeof c.algo) == 0) {
        if (!c.used && c.from_file) ++reused_;
        c.used = true;
        return c.index;
      }
      c = timed_now(r);  // the heuristic no longer offers the cached algorithm there: time again
      return c.index;
    }
    return entries_.emplace_back(r.key, timed_now(r)).second.index;
  }

  // Writes the cache file when this run timed something new (a warning when it cannot).
  void save() {
    std::vector<std::string> lines;
    for (const auto& [key, c] : entries_) {
      std::string line = "lt";
      for (std::int64_t v : key) line += " " + std::to_string(v);
      char tail[256];
      std::snprintf(tail, sizeof tail, " | %d", c.index);
      line += tail;
      for (std::uint64_t word : c.algo.data) {
        std::snprintf(tail, sizeof tail, " %016" PRIx64, word);
        line += tail;
      }
      std::snprintf(tail, sizeof tail, " | %.3f %.3f %d", c.tuned_us, c.heuristic_us, c.candidates);
      line += tail;
      lines.push_back(line);
    }
    file_.save(lines);
  }

  index_t tuned() const { return tuned_; }    // plans timed by this tuner
  index_t reused() const { return reused_; }  // plans found in the cache file
  index_t loaded() const { return loaded_; }  // choices read from the file
  const tune::TuneFile& cache() const { return file_; }

  // One line per plan this run used: "  gemm bf16->bf16 NT [64 x 256 x 400] relu_aux_bias:
  // algorithm #2 of 8 3.1 us (heuristic 3.6 us, 1.16x), timed now".
  std::string report() const {
    std::string out;
    for (const auto& [k, c] : entries_) {
      if (!c.used) continue;
      char line[320];
      std::snprintf(line, sizeof line,
                    "  gemm %s->%s%s %c%c [%lld x %lld x %lld] %s: %s %.1f us (heuristic %.1f us, %.2fx), %s\n",
                    to_string(LtType(k[5])), to_string(LtType(k[6])), k[7] ? " tf32" : "", k[3] ? 'T' : 'N',
                    k[4] ? 'T' : 'N', (long long)k[0], (long long)k[1], (long long)k[2], to_string(Epilogue(k[8])),
                    c.index == 0 ? "the heuristic's first algorithm"
                                 : ("algorithm #" + std::to_string(c.index + 1) + " of " +
                                    std::to_string(c.candidates))
                                       .c_str(),
                    c.tuned_us, c.heuristic_us, c.tuned_us > 0 ? c.heuristic_us / c.tuned_us : 1.0,
                    c.from_file ? "from the cache" : "timed now");
      out += line;
    }
    return out;
  }

  // What the choices depend on: the device, cuBLASLt and the CUDA runtime, kiln.
  static std::string fingerprint() {
    int device = 0, runtime = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    KILN_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    return ::kiln::detail::concat("gpu=", prop.name, "; sm=", prop.major, ".", prop.minor,
                                  "; cublasLt=", cublasLtGetVersion(), "; cudart=", runtime,
                                  "; kiln=", ::kiln::version);
  }

 private:
  class TimingEvent {
   public:
    TimingEvent() { KILN_CUDA_CHECK(cudaEventCreate(&event_)); }
    TimingEvent(const TimingEvent&) = delete;
    TimingEvent& operator=(const TimingEvent&) = delete;
    ~TimingEvent() { (void)cudaEventDestroy(event_); }
    cudaEvent_t get() const { return event_; }

   private:
    cudaEvent_t event_ = nullptr;
  };

  // Bytes that cover a row-major matrix of `rows` rows at row stride `ld`, of `elem` bytes each.
  static std::size_t span(index_t rows, index_t ld, std::size_t elem) {
    return static_cast<std::size_t>(std::max<index_t>(rows, 1) * std::max<index_t>(ld, 1)) * elem;
  }
  static void fill(DeviceBuffer<std::byte>& buffer, cudaStream_t stream) {
    if (buffer.size() > 0) KILN_CUDA_CHECK(cudaMemsetAsync(buffer.data(), 0x3c, std::size_t(buffer.size()), stream));
  }
  static std::size_t elem_bytes(LtType t) { return t == LtType::f32 ? 4 : 2; }

  // A choice timed by this run (the cache file is rewritten at save()).
  LtTunedChoice timed_now(const LtChoiceRequest& r) {
    LtTunedChoice c = measure(r);
    c.used = true;
    ++tuned_;
    file_.changed();
    return c;
  }

  LtTunedChoice measure(const LtChoiceRequest& r) const {
    const MatmulArgs& x = r.args;
    const std::size_t in = elem_bytes(x.in_type), out = elem_bytes(x.out_type);
    // Private operands: as large as the real ones (strides included), as aligned or more (the
    // allocator's blocks are 256-byte aligned), filled with 0x3c bytes — finite, non-zero
    // values in every type (f32 0.0115, f16 1.06, bf16 0.0115).
    DeviceBuffer<std::byte> a(index_t(span(x.trans_a ? x.k : x.m, x.lda, in)), r.allocator);
    DeviceBuffer<std::byte> b(index_t(span(x.trans_b ? x.n : x.k, x.ldb, in)), r.allocator);
    DeviceBuffer<std::byte> d(index_t(span(x.m, std::max(x.ldd, x.c != nullptr ? x.ldc : 0), out)), r.allocator);
    DeviceBuffer<std::byte> bias(index_t(x.bias != nullptr ? std::max(x.m, x.n) * 4 : 0), r.allocator);
    DeviceBuffer<std::byte> aux(index_t(x.aux != nullptr ? span(x.m, x.aux_ld, out) : 0), r.allocator);
    std::size_t workspace_bytes = 0;
    for (int i = 0; i < r.count; ++i) workspace_bytes = std::max(workspace_bytes, r.found[i].workspaceSize);
    DeviceBuffer<std::byte> workspace(index_t(workspace_bytes), r.allocator);
    fill(a, r.stream);
    fill(b, r.stream);
    fill(d, r.stream);
    fill(bias, r.stream);
    fill(aux, r.stream);
    cublasLtMatmulDesc_t desc = r.plan.desc.get();
    if (x.bias != nullptr) detail::lt_set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(bias.data()));
    if (x.aux != nullptr) detail::lt_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(aux.data()));

    auto run = [&](int i) {
      return cublasLtMatmul(r.handle, desc, &x.alpha, b.data(), r.plan.a.get(), a.data(), r.plan.b.get(), &x.beta,
                            d.data(), r.plan.c.get(), d.data(), r.plan.d.get(), &r.found[i].algo, workspace.data(),
                            r.found[i].workspaceSize, r.stream);
    };
    const TimingEvent start_event, stop_event;
    cudaEvent_t start = start_event.get(), stop = stop_event.get();
    // Microseconds per call over `reps` calls of candidate i; infinity when cuBLASLt refuses it.
    auto timed = [&](int i, int reps) {
      KILN_CUDA_CHECK(cudaEventRecord(start, r.stream));
      for (int rep = 0; rep < reps; ++rep)
        if (run(i) != CUBLAS_STATUS_SUCCESS) return std::numeric_limits<double>::infinity();
      KILN_CUDA_CHECK(cudaEventRecord(stop, r.stream));
      KILN_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      return 1e3 * double(ms) / reps;
    };

    // Warm-up: one call each, which also sizes the burst.
    std::vector<int> reps(static_cast<std::size_t>(r.count), 1);
    for (int i = 0; i < r.count; ++i) {
      const double once = timed(i, 1);
      if (std::isfinite(once)) reps[std::size_t(i)] = std::clamp(int(50.0 / std::max(once, 0.5)), 1, 100);
    }
    std::vector<std::vector<double>> times(static_cast<std::size_t>(r.count));
    double spent_us = 0;
    for (int round = 0; round < options_.max_rounds && (round < options_.min_rounds || spent_us < options_.budget_ms * 1e3);
         ++round)
      for (int i = 0; i < r.count; ++i) {
        const double t = timed(i, reps[std::size_t(i)]);
        times[std::size_t(i)].push_back(t);
        if (std::isfinite(t)) spent_us += t * reps[std::size_t(i)];
      }
    KILN_CUDA_CHECK(cudaGetLastError());
    std::vector<double> median(static_cast<std::size_t>(r.count));
    for (std::size_t i = 0; i < median.size(); ++i) {
      std::sort(times[i].begin(), times[i].end());
      median[i] = times[i][times[i].size() / 2];
    }
    int best = 0;
    for (int i = 1; i < r.count; ++i)
      if (median[std::size_t(i)] < median[std::size_t(best)]) best = i;
    if (!(median[std::size_t(best)] <= (1.0 - options_.margin) * median[0])) best = 0;
    LtTunedChoice c;
    c.index = best;
    c.algo = r.found[best].algo;
    c.tuned_us = median[std::size_t(best)];
    c.heuristic_us = median[0];
    c.candidates = r.count;
    return c;
  }

  bool parse(const std::string& line, std::string& why) {
    const auto bad = [&] {
      why = "a line does not parse: \"" + line.substr(0, 80) + "\"";
      return false;
    };
    if (line.rfind("lt ", 0) != 0) return bad();
    const char* p = line.c_str() + 3;
    LtKey key{};
    for (std::int64_t& v : key) {
      char* end = nullptr;
      errno = 0;
      v = std::strtoll(p, &end, 10);
      if (end == p || errno != 0) return bad();
      p = end;
    }
    LtTunedChoice c;
    int consumed = 0;
    if (std::sscanf(p, " | %d%n", &c.index, &consumed) != 1 || c.index < 0) return bad();
    p += consumed;
    for (std::uint64_t& word : c.algo.data) {
      if (std::sscanf(p, " %16" SCNx64 "%n", &word, &consumed) != 1) return bad();
      p += consumed;
    }
    if (std::sscanf(p, " | %lf %lf %d%n", &c.tuned_us, &c.heuristic_us, &c.candidates, &consumed) != 3 ||
        p[consumed] != '\0' || c.index >= c.candidates || key[0] < 1 || key[1] < 1 || key[2] < 1)
      return bad();
    c.from_file = true;
    entries_.emplace_back(key, c);
    return true;
  }

  tune::GemmTunerOptions options_;
  tune::TuneFile file_;
  std::deque<std::pair<LtKey, LtTunedChoice>> entries_;
  index_t tuned_ = 0, reused_ = 0, loaded_ = 0;
};

}  // namespace kiln::cu

// kiln/autograd/anomaly.hpp — anomaly mode, kiln's torch.autograd.detect_anomaly: every result a
// model layer materialises in forward, and every gradient a backward step writes, is checked for
// NaN and infinity, and the first one found throws a NumericError naming the layer (its index and
// what it runs), forward or backward, the element and the shape; train::Step adds the step.
//
//   { kiln::ag::DetectAnomaly on; step(batch); }      // or kiln::ag::set_detect_anomaly(true)
//
// Off by default. Cost when on: one pass over every layer output and every gradient written — on
// CUDA a device-to-host copy and a wait each (expect a step several times slower); nothing when
// off but one flag test per layer and per backward step. Under fp16 loss scaling the overflows the
// scaler would skip are reported too: it is a tool for finding where an inf is born.
#pragma once

#include <atomic>
#include <string>
#include <utility>

#include "kiln/core/error.hpp"
#include "kiln/core/finite.hpp"

namespace kiln::ag {

namespace detail {
inline std::atomic<bool>& anomaly_flag() {
  static std::atomic<bool> on{false};
  return on;
}
// What is running forward now ("layer 2 (Linear<256, 128>+relu)"), nested with " > ".
inline std::string& anomaly_label() {
  thread_local std::string label;
  return label;
}
}  // namespace detail

inline bool detect_anomaly() { return detail::anomaly_flag().load(std::memory_order_relaxed); }
inline void set_detect_anomaly(bool on) { detail::anomaly_flag().store(on, std::memory_order_relaxed); }

// Anomaly mode on (or off) for a scope; the previous setting comes back at its end.
class DetectAnomaly {
 public:
  explicit DetectAnomaly(bool on = true) : was_(detect_anomaly()) { set_detect_anomaly(on); }
  ~DetectAnomaly() { set_detect_anomaly(was_); }
  DetectAnomaly(const DetectAnomaly&) = delete;
  DetectAnomaly& operator=(const DetectAnomaly&) = delete;

 private:
  bool was_;
};

// Names what records during its scope (Sequential names each layer); backward steps recorded
// then carry the name.
class AnomalyLabel {
 public:
  explicit AnomalyLabel(const std::string& part) : saved_(detail::anomaly_label()) {
    detail::anomaly_label() = saved_.empty() ? part : saved_ + " > " + part;
  }
  ~AnomalyLabel() { detail::anomaly_label() = std::move(saved_); }
  AnomalyLabel(const AnomalyLabel&) = delete;
  AnomalyLabel& operator=(const AnomalyLabel&) = delete;

 private:
  std::string saved_;
};

// Throws when a forward result holds a NaN or infinity.
template <class V>
void check_forward(const V& result) {
  const index_t bad = first_nonfinite<typename V::value_type, typename V::space>(result.value().data(),
                                                                                  result.value().size());
  KILN_CHECK(bad < 0, NumericError, "anomaly mode: the forward of ", detail::anomaly_label(),
             " produced a non-finite value at element ", bad, " of its output ", result.shape().str(),
             " (its input was finite)");
}

}  // namespace kiln::ag

// kiln/core/stats.hpp — every kernel or library call is counted in one place.
//
// Each executor owns a LaunchStats. Counting is always on (an integer add); recording what ran
// (name, elements, bytes moved) is a debug mode, switched on per executor. This is the base of
// the fusion report: "this step ran 7 kernels: 3 gemm, 3 elementwise, 1 optimizer".
#pragma once

#include <cstddef>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/config.hpp"

namespace kiln {

// Kinds of launch, for reports by kind.
namespace kind {
inline constexpr const char* elementwise = "elementwise";
inline constexpr const char* reduce = "reduce";
inline constexpr const char* gemm = "gemm";
inline constexpr const char* loss = "loss";
inline constexpr const char* norm = "norm";
inline constexpr const char* optimizer = "optimizer";
inline constexpr const char* copy = "copy";
inline constexpr const char* other = "other";
}  // namespace kind

struct LaunchRecord {
  std::string kind;
  std::string name;
  index_t elements = 0;
  std::size_t bytes = 0;
  std::string region;  // the opaque region it ran in (nn::Opaque), empty outside one
};

class LaunchStats {
 public:
  void count(const char* k, std::string_view name, index_t elements, std::size_t bytes) {
    ++total_;
    ++by_kind_[k];
    if (recording_) records_.push_back({k, std::string(name), elements, bytes, region_});
    if (watching_ && launches_must_be_inside_ && !in_launch_ && uncaptured_.empty())
      uncaptured_ = std::string(k) + " " + std::string(name);
  }
  // While an executor captures a step (mode::reduce_overhead on the CPU, kiln/backend/cpu/
  // step_graph.hpp), a launch counted outside its launch() is one a replay would not run again,
  // and so is an opaque region (set_region): the first such launch ("kind name") or region is
  // remembered, and the step is not replayed.
  // A CUDA executor captures every launch on its stream itself: only regions and host state
  // count there (launches_must_be_inside = false).
  void watch_capture(bool on, bool launches_must_be_inside = true) {
    watching_ = on;
    launches_must_be_inside_ = launches_must_be_inside;
    if (on) uncaptured_.clear();
  }
  // A layer whose forward changes host-side state every step (dropout's random offset, batch
  // norm's count of batches) says so: a replay would not change it, so a capture is refused.
  void host_state(std::string_view what) {
    if (watching_ && uncaptured_.empty()) uncaptured_ = std::string(what) + " (state kept on the host)";
  }
  // Drops the records from position n on (an executor that recorded a capture's launches for
  // itself).
  void drop_records_from(std::size_t n) {
    if (n < records_.size()) records_.resize(n);
  }
  void set_in_launch(bool on) { in_launch_ = on; }
  const std::string& uncaptured() const { return uncaptured_; }
  // Launches recorded while a region is set carry its name (an opaque user function, for the
  // report); regions do not nest (the inner one wins while it lasts).
  const std::string& region() const { return region_; }
  std::string set_region(std::string r) {
    // A region (an opaque function) may do host work no launch shows: a capture cannot replay it.
    if (watching_ && !r.empty() && uncaptured_.empty()) uncaptured_ = r;
    return std::exchange(region_, std::move(r));
  }
  std::size_t launches() const { return total_; }
  std::size_t launches(std::string_view k) const {
    auto it = by_kind_.find(std::string(k));
    return it == by_kind_.end() ? 0 : it->second;
  }
  const std::map<std::string, std::size_t>& by_kind() const { return by_kind_; }
  const std::vector<LaunchRecord>& records() const { return records_; }
  void set_recording(bool on) { recording_ = on; }
  bool recording() const { return recording_; }
  void reset() {
    total_ = 0;
    by_kind_.clear();
    records_.clear();
  }
  // "7 launches: 3 gemm, 3 elementwise, 1 optimizer"
  std::string summary() const {
    std::ostringstream out;
    out << total_ << (total_ == 1 ? " launch" : " launches");
    const char* sep = ": ";
    for (const auto& [k, n] : by_kind_) {
      out << sep << n << ' ' << k;
      sep = ", ";
    }
    return out.str();
  }

 private:
  std::size_t total_ = 0;
  std::map<std::string, std::size_t> by_kind_;
  std::vector<LaunchRecord> records_;
  std::string region_;
  bool recording_ = false;
  bool watching_ = false, in_launch_ = false, launches_must_be_inside_ = true;
  std::string uncaptured_;
};

}  // namespace kiln

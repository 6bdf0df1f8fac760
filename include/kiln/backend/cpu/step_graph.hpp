// kiln/backend/cpu/step_graph.hpp — a captured training step on the CPU (mode::reduce_overhead):
// the launches one step made, kept with their arguments, run again in order on the same buffers.
//
// The counterpart of a CUDA graph. The first step at a batch shape runs as usual while the
// executor keeps a copy of each launch (CpuExecutor::launch); its buffers come from the graph's
// pool (kiln/core/host_graph_pool.hpp), so they stay where the launches expect them. A replay
// then runs the launches alone: no autograd tape, no graph of results, no allocation. What a
// replay cannot see — host code outside a launch — makes the capture not replayable: every
// launch counted outside CpuExecutor::launch() during the capture is noticed (LaunchStats), and
// the step stays eager at that shape, saying which launch it was.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/host_graph_pool.hpp"

namespace kiln::cpu {

class StepGraph {
 public:
  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs the captured launches again, in order. Allocates nothing (a launch's scratch was taken
  // at capture and is part of what it holds).
  void replay() const {
    for (const Launch& l : launches_) l.run(l.name);
  }
  std::size_t size() const { return launches_.size(); }
  // Empty when the capture can be replayed; otherwise the first launch made outside
  // CpuExecutor::launch() ("kind name").
  const std::string& not_replayable() const { return not_replayable_; }
  bool replayable() const { return not_replayable_.empty(); }
  // Bytes the capture's buffers hold in the graph's pool.
  std::size_t pool_bytes() const { return pool_.pool().bytes(); }

  // For CpuExecutor: the pool capture-time allocations come from, and the launches it keeps.
  kiln::detail::HostGraphPool& pool() const { return pool_.pool(); }
  template <class F>
  void add(std::string_view name, const F& f) {
    launches_.push_back({std::string(name), f});
  }
  void set_not_replayable(std::string why) { not_replayable_ = std::move(why); }

 private:
  struct Launch {
    std::string name;
    std::function<void(std::string_view)> run;
  };
  kiln::detail::HostPoolHandle pool_;
  std::vector<Launch> launches_;
  std::string not_replayable_;
};

}  // namespace kiln::cpu

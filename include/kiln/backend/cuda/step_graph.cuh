// kiln/backend/cuda/step_graph.cuh — a captured training step on CUDA (mode::reduce_overhead): a
// CUDA graph of the step's kernels and library calls, replayed with one cudaGraphLaunch.
//
// CudaExecutor::begin_capture switches the executor to its own capture stream (the legacy
// default stream cannot be captured) and this thread's device allocations to the graph's private
// pool (kiln/backend/cuda/allocator.cuh); end_capture instantiates the graph. Nothing runs while
// a stream is captured: the training step replays the graph once right after. The launches the
// capture counted are kept, and each replay counts them again, so kernel counts read the same as
// in eager steps. A capture that fails (a host synchronisation or a call CUDA cannot capture
// inside the step, a layer with host-side state, an opaque function) leaves the graph not
// replayable, with the reason.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/core/stats.hpp"

namespace kiln::cu {

class StepGraph {
 public:
  StepGraph() : pool_(default_allocator().create_private_pool()) {}
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph() {
    if (exec_) (void)cudaGraphExecDestroy(exec_);
    if (graph_) (void)cudaGraphDestroy(graph_);
    default_allocator().release_private_pool(pool_);
  }

  // Queues the whole captured step on `stream`; counts its launches in `stats` unless told not to
  // (the replay right after a capture, whose launches the capture counted).
  void replay(cudaStream_t stream, LaunchStats& stats, bool count = true) const {
    KILN_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
    if (!count) return;
    for (const LaunchRecord& r : launches_) stats.count(r.kind.c_str(), r.name, r.elements, r.bytes);
  }
  bool replayable() const { return exec_ != nullptr && not_replayable_.empty(); }
  const std::string& not_replayable() const { return not_replayable_; }
  std::size_t size() const { return launches_.size(); }
  std::size_t pool_bytes() const { return default_allocator().private_bytes(pool_); }

  // For CudaExecutor.
  CachingAllocator::PoolId pool() const { return pool_; }
  void set_graph(cudaGraph_t graph, cudaGraphExec_t exec, std::vector<LaunchRecord> launches) {
    graph_ = graph;
    exec_ = exec;
    launches_ = std::move(launches);
  }
  void set_not_replayable(std::string why) { not_replayable_ = std::move(why); }

 private:
  CachingAllocator::PoolId pool_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::vector<LaunchRecord> launches_;
  std::string not_replayable_;
};

}  // namespace kiln::cu

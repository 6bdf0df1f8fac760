// kiln/dist/device_reducer.cuh — the data-parallel step's gradient averaging for a model on a
// GPU: what dist::GradientReducer does on host memory (kiln/dist/data_parallel.hpp), on NCCL.
//
// - The same checks and buckets (kiln/dist/buckets.hpp); parameters broadcast from rank 0 on the
//   executor's stream.
// - A bucket is one NCCL group of in-place all-reduces with ncclAvg over its parameters'
//   gradients (no packing copy: NCCL fuses a group's collectives), on a communication stream of
//   its own.
// - Overlap: when backward reports a bucket's gradients final, the communication stream waits for
//   the work queued so far on the executor's stream (an event) and all-reduces the bucket while
//   the rest of backward runs on the executor's stream — the GPU overlaps them, the host only
//   queues. finish() queues the remaining buckets, and the executor's stream waits for the
//   communication stream before the optimizer reads a gradient. Nothing waits on the host.
// - A backward that is being captured into a CUDA graph (mode::reduce_overhead) does not overlap:
//   its replays run no tape, so finish() reduces every bucket after them, outside the graph.
// - Every rank's collectives are watched (kiln/dist/nccl.cuh): a rank that died ends the others'
//   wait with a DistError after the timeout.
// A group of one rank runs every collective too (an average over one), as PyTorch's DDP does at
// world size 1: the tests on one GPU go through NCCL.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kiln/backend/cuda/check.cuh"
#include "kiln/dist/buckets.hpp"
#include "kiln/dist/data_parallel.hpp"
#include "kiln/dist/nccl.cuh"
#include "kiln/optim/param.hpp"

namespace kiln::dist {

class DeviceGradientReducer {
 public:
  // On the current device (dist::use_local_device picks it from the local rank); `exec` is the
  // CUDA executor the step runs on.
  // throws: DistError when NCCL is missing or refuses; ValueError for bucket_bytes <= 0.
  template <class Exec>
  DeviceGradientReducer(ProcessGroup& group, const optim::ParamTable& table, DataParallelOptions options, Exec& exec)
      : nccl_(group),
        table_(&table),
        options_(options),
        plan_(table, options.bucket_bytes),
        exec_(&exec),
        exec_stream_([](const void* e) { return static_cast<const Exec*>(e)->stream(); }) {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&reduced_, cudaEventDisableTiming));
  }
  DeviceGradientReducer(const DeviceGradientReducer&) = delete;
  DeviceGradientReducer& operator=(const DeviceGradientReducer&) = delete;
  ~DeviceGradientReducer() {
    if (comm_stream_ != nullptr) (void)cudaStreamSynchronize(comm_stream_);
    if (ready_ != nullptr) (void)cudaEventDestroy(ready_);
    if (reduced_ != nullptr) (void)cudaEventDestroy(reduced_);
    if (comm_stream_ != nullptr) (void)cudaStreamDestroy(comm_stream_);
  }

  NcclGroup& nccl() { return nccl_; }
  index_t buckets() const { return plan_.count(); }
  index_t bucket_of(index_t slot) const { return plan_.bucket_of(slot); }
  // Buckets all-reduced during backward.
  index_t buckets_overlapped() const { return overlapped_; }

  // throws: DistError naming the first parameter whose count or size differs from rank 0's.
  void check_same_model() {
    dist::check_same_model(*table_, nccl_.size(), [&](const std::int64_t* in, index_t n, std::int64_t* out) {
      nccl_.all_gather_host(in, n, out);
    });
  }

  // Rank 0's parameter values on every rank (queued on the executor's stream).
  void broadcast_parameters() {
    nccl_.batched([&] {
      for (index_t k = 0; k < table_->count(); ++k)
        if ((*table_)[k].size > 0) nccl_.broadcast((*table_)[k].value, (*table_)[k].size, 0, stream());
    });
    nccl_.watch(stream(), "broadcast of the parameters");
  }

  bool overlaps() const { return options_.overlap; }
  // The executor's stream as it is now (its capture stream while a step is captured).
  cudaStream_t stream() const { return exec_stream_(exec_); }

  // Before the backward whose gradients the next optimizer step takes.
  void begin_backward() {
    plan_.begin();
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    // The stream the step runs on NOW: while reduce_overhead captures, the executor's capture
    // stream, not the one it was built with (asking that one said "not capturing", and the
    // all-reduce then ran eagerly on the previous step's gradients).
    KILN_CUDA_CHECK(cudaStreamIsCapturing(stream(), &capturing));
    overlap_now_ = capturing == cudaStreamCaptureStatusNone;
  }

  // The tape's word that a leaf's gradient is final (ag::BackwardOptions::on_leaf_ready).
  void leaf_ready(const ag::VarNode& node) {
    if (!overlap_now_) return;
    const index_t b = plan_.leaf_ready(node);
    if (b >= 0) launch(b);
  }

  // Every gradient becomes its average over the ranks, in stream order: the executor's stream
  // waits for the communication stream. throws: DistError (a refused call, an aborted communicator).
  void finish() {
    for (index_t b = 0; b < plan_.count(); ++b) {
      if (plan_.launched(b)) ++overlapped_;
      else launch(b);
    }
    plan_.end_step();
    overlap_now_ = false;
    KILN_CUDA_CHECK(cudaEventRecord(reduced_, comm_stream_));
    KILN_CUDA_CHECK(cudaStreamWaitEvent(stream(), reduced_, 0));
    nccl_.watch(comm_stream_, "the gradient all-reduce");
  }

 private:
  // Bucket b's gradients all-reduced on the communication stream, after the executor's work so far.
  void launch(index_t b) {
    KILN_CUDA_CHECK(cudaEventRecord(ready_, stream()));
    KILN_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_, 0));
    nccl_.batched([&] {
      for (index_t k : plan_.slots(b)) {
        const optim::ParamSlot& slot = (*table_)[k];
        if (slot.has_gradient()) nccl_.all_reduce(slot.grad, slot.size, ReduceOp::average, comm_stream_);
      }
    });
  }

  NcclGroup nccl_;
  const optim::ParamTable* table_;
  DataParallelOptions options_;
  BucketPlan plan_;
  const void* exec_;                           // the executor the step runs on
  cudaStream_t (*exec_stream_)(const void*);   // its stream() now
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, reduced_ = nullptr;
  bool overlap_now_ = false;
  index_t overlapped_ = 0;
};

}  // namespace kiln::dist

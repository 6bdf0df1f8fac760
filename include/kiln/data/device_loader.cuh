// kiln/data/device_loader.cuh — a host Loader's batches, uploaded to the device one batch ahead.
//
// Each batch goes host Loader → pinned staging buffer (a memcpy on the calling thread) → device
// buffer (cudaMemcpyAsync on the loader's OWN non-blocking stream). Two slots alternate, so while
// the consumer's stream works on batch i, batch i + 1 is on its way. Events order the two streams;
// nothing synchronises the device:
//   - the consumer's stream waits (cudaStreamWaitEvent) for the upload of the batch next() returns;
//   - when the consumer gives a batch up, an event is recorded on the consumer's stream, and the
//     upload that next reuses that slot's device buffers waits for it;
//   - the host waits (cudaEventSynchronize) for a slot's previous upload before refilling its
//     staging buffers — normally long finished.
//
//   kiln::data::Loader host_loader(train, {.batch_size = 256, .seed = 1});
//   kiln::data::DeviceLoader loader(host_loader, exec.stream());
//   for (index_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.start_epoch(epoch);
//     while (const kiln::data::DeviceBatch* batch = loader.next()) {
//       ... launch work on exec.stream() reading batch->features, batch->labels ...
//     }
//   }
//
// Contract:
// - The DeviceBatch and the device memory it points to are valid until the next call of next(),
//   start_epoch() or the destructor. Work that reads them must be ENQUEUED on the consumer stream
//   (or on a stream that waits for it) before that call; it may still be running: the slot is
//   reused only after the consumer stream has passed that point.
// - Data is ready for work enqueued on the consumer stream after next() returns. Other streams
//   must wait for the consumer stream (an event) before reading a batch.
// - The order of batches is the host Loader's (a pure function of seed and epoch). An exception
//   from the host loader (e.g. its transform) is re-thrown from next() when the consumer reaches
//   that batch, and again from every later next() until start_epoch().
// - The Loader is referenced, not copied: it must outlive the DeviceLoader and is driven only by
//   it (calling its next() directly would steal batches). One consumer thread.
// - The destructor waits for the consumer stream's work on the last batch and for pending
//   uploads before freeing the buffers.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <utility>

#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/pinned.cuh"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/data/batch_loader.hpp"
#include "kiln/data/loader.hpp"

namespace kiln::data {

// One mini-batch in device memory: `size` rows of `dim` features, row-major and contiguous.
struct DeviceBatch {
  using space = kiln::cuda;        // where features and labels live
  float* features = nullptr;       // device, size × dim (nullptr when that is 0)
  std::int32_t* labels = nullptr;  // device, size
  index_t size = 0;
  index_t dim = 0;
  index_t index = 0;  // position within the epoch, from 0
  index_t epoch = 0;
};

namespace detail {

// A non-blocking stream: it does not serialise with the legacy default stream, so the uploads
// overlap a consumer on stream 0 too; ordering is by events alone.
class OwnedStream {
 public:
  OwnedStream() { KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~OwnedStream() {
    if (stream_ != nullptr && cudaStreamDestroy(stream_) != cudaSuccess) (void)cudaGetLastError();
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  cudaStream_t get() const noexcept { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// An event for ordering only (no timing, which makes record and wait cheaper). A fresh event
// counts as complete: waiting on one never recorded returns at once.
class OwnedEvent {
 public:
  OwnedEvent() { KILN_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~OwnedEvent() {
    if (event_ != nullptr && cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();
  }
  OwnedEvent(const OwnedEvent&) = delete;
  OwnedEvent& operator=(const OwnedEvent&) = delete;
  cudaEvent_t get() const noexcept { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace detail

class DeviceLoader {
 public:
  // Allocates two slots of batch_size × dim features and batch_size labels, pinned and on the
  // device. consumer_stream: the stream whose work reads the batches (nullptr: the legacy default
  // stream). Throws CudaError / OutOfMemoryError when the runtime cannot provide them.
  DeviceLoader(Loader& loader, cudaStream_t consumer_stream) : loader_(&loader), consumer_(consumer_stream) {
    const index_t b = loader.batch_size(), d = loader.dataset().d;
    for (Slot& s : slots_) {
      s.h_features = cu::PinnedBuffer<float>(b * d);
      s.h_labels = cu::PinnedBuffer<std::int32_t>(b);
      s.d_features = cu::DeviceBuffer<float>(b * d);
      s.d_labels = cu::DeviceBuffer<std::int32_t>(b);
      // The slot's first upload waits for what the consumer stream has queued by now: the
      // allocator is not stream-aware, so these device buffers may be blocks that work still
      // queued there uses (a step's freed temporaries, train::accuracy's new loader right after
      // it). Without a record the event has never fired, and the wait on it is no wait at all.
      KILN_CUDA_CHECK(cudaEventRecord(s.consumed.get(), consumer_));
    }
  }

  DeviceLoader(const DeviceLoader&) = delete;  // the streams' pending work refers to our buffers
  DeviceLoader& operator=(const DeviceLoader&) = delete;

  ~DeviceLoader() {
    // Failures here (the runtime shutting down, a sticky fault) cannot be handled: clear them.
    if (current_ >= 0 && cudaEventRecord(slots_[current_].consumed.get(), consumer_) != cudaSuccess)
      (void)cudaGetLastError();
    if (cudaStreamSynchronize(copy_.get()) != cudaSuccess) (void)cudaGetLastError();
    for (Slot& s : slots_)
      if (cudaEventSynchronize(s.consumed.get()) != cudaSuccess) (void)cudaGetLastError();
  }

  // Begins epoch `epoch` of the host loader (see Loader::start_epoch), abandons the rest of the
  // current one and starts uploading its first batch. The batch handed out last becomes invalid.
  void start_epoch(index_t epoch, index_t first_batch = 0) {
    const auto t0 = std::chrono::steady_clock::now();
    release_current();
    pending_ = -1;
    error_ = nullptr;
    started_ = false;
    loader_->start_epoch(epoch, first_batch);
    taken_ = first_batch;
    started_ = true;
    stage(0);
    wait_ += std::chrono::steady_clock::now() - t0;
  }

  // The next batch of the epoch, its upload ordered before any work enqueued on the consumer
  // stream from now on; nullptr once the epoch is exhausted. Gives up the previous batch and
  // starts uploading the following one before it returns.
  const DeviceBatch* next() {
    KILN_CHECK(started_, ValueError, "DeviceLoader: call start_epoch(epoch) before next()");
    const auto t0 = std::chrono::steady_clock::now();
    struct AddTime {  // also on the way out by an exception
      std::chrono::steady_clock::duration& total;
      std::chrono::steady_clock::time_point t0;
      ~AddTime() { total += std::chrono::steady_clock::now() - t0; }
    } add_time{wait_, t0};
    release_current();
    if (pending_ < 0) {
      if (error_) std::rethrow_exception(error_);
      return nullptr;
    }
    const int s = pending_;
    pending_ = -1;
    KILN_CUDA_CHECK(cudaStreamWaitEvent(consumer_, slots_[s].copied.get(), 0));
    current_ = s;
    ++served_;
    ++taken_;
    stage(1 - s);
    return &slots_[s].batch;
  }

  // Host seconds spent in next() and start_epoch() — waiting for the host loader, for a staging
  // buffer, and filling it — since construction or reset_stats(), over all epochs. Near zero when
  // the input pipeline keeps up with the consumer; the device-side wait for an upload is not
  // included (it blocks no host thread).
  double wait_seconds() const { return std::chrono::duration<double>(wait_).count(); }
  index_t batches_served() const { return served_; }
  // Batches handed out this epoch (from start_epoch's first_batch).
  index_t batches_taken() const { return taken_; }
  void reset_stats() {
    wait_ = {};
    served_ = 0;
  }

  index_t batches_per_epoch() const { return loader_->batches_per_epoch(); }
  Loader& loader() const { return *loader_; }
  cudaStream_t consumer_stream() const { return consumer_; }
  cudaStream_t copy_stream() const { return copy_.get(); }

 private:
  struct Slot {
    cu::PinnedBuffer<float> h_features;
    cu::PinnedBuffer<std::int32_t> h_labels;
    cu::DeviceBuffer<float> d_features;
    cu::DeviceBuffer<std::int32_t> d_labels;
    detail::OwnedEvent copied;    // recorded on the copy stream after this slot's upload
    detail::OwnedEvent consumed;  // recorded on the consumer stream when its batch is given up
    DeviceBatch batch;
  };

  // The consumer gives up the batch it holds: everything it enqueued so far may read it, nothing
  // later. The next upload into that slot waits for this point of the consumer stream.
  void release_current() {
    if (current_ < 0) return;
    KILN_CUDA_CHECK(cudaEventRecord(slots_[current_].consumed.get(), consumer_));
    current_ = -1;
  }

  // Takes the host loader's next batch into slot t and enqueues its upload; sets pending_ = t,
  // or leaves it -1 at the end of the epoch or when the host loader threw (kept in error_).
  void stage(int t) {
    const Batch* hb = nullptr;
    try {
      hb = loader_->next();
    } catch (...) {
      error_ = std::current_exception();
      return;
    }
    if (hb == nullptr) return;
    Slot& slot = slots_[t];
    const auto nf = static_cast<index_t>(hb->features.size()), nl = static_cast<index_t>(hb->labels.size());
    KILN_CHECK(nf == hb->size * hb->dim && nl == hb->size && nf <= slot.h_features.size() &&
                   nl <= slot.h_labels.size(),
               ValueError, "DeviceLoader: batch ", hb->index, " holds ", nf, " features and ", nl,
               " labels for size ", hb->size, " × dim ", hb->dim, "; the slots hold at most ",
               slot.h_labels.size(), " rows of ", loader_->dataset().d, " (did a transform resize it?)");
    // The staging buffers were last read by this slot's previous upload.
    KILN_CUDA_CHECK(cudaEventSynchronize(slot.copied.get()));
    if (nf > 0) std::memcpy(slot.h_features.data(), hb->features.data(), std::size_t(nf) * sizeof(float));
    if (nl > 0) std::memcpy(slot.h_labels.data(), hb->labels.data(), std::size_t(nl) * sizeof(std::int32_t));
    // The device buffers are free once the consumer stream is past its last use of this slot.
    KILN_CUDA_CHECK(cudaStreamWaitEvent(copy_.get(), slot.consumed.get(), 0));
    if (nf > 0)
      KILN_CUDA_CHECK(cudaMemcpyAsync(slot.d_features.data(), slot.h_features.data(), std::size_t(nf) * sizeof(float),
                                      cudaMemcpyHostToDevice, copy_.get()));
    if (nl > 0)
      KILN_CUDA_CHECK(cudaMemcpyAsync(slot.d_labels.data(), slot.h_labels.data(),
                                      std::size_t(nl) * sizeof(std::int32_t), cudaMemcpyHostToDevice, copy_.get()));
    KILN_CUDA_CHECK(cudaEventRecord(slot.copied.get(), copy_.get()));
    slot.batch = DeviceBatch{nf > 0 ? slot.d_features.data() : nullptr, slot.d_labels.data(), hb->size, hb->dim,
                             hb->index, hb->epoch};
    pending_ = t;
  }

  Loader* loader_;
  cudaStream_t consumer_;
  detail::OwnedStream copy_;
  std::array<Slot, 2> slots_;
  int current_ = -1;  // the slot of the batch the consumer holds
  int pending_ = -1;  // the slot of the batch being uploaded for the next next()
  std::exception_ptr error_;
  bool started_ = false;
  index_t served_ = 0;
  index_t taken_ = 0;
  std::chrono::steady_clock::duration wait_{};
};

// BatchLoader in device memory (kiln/data/batch_loader.hpp): a host Loader and a DeviceLoader
// that uploads its batches for work on the executor's stream.
template <>
class BatchLoader<cuda> {
 public:
  template <class Exec>
  BatchLoader(const Dataset& dataset, LoaderOptions options, Exec& exec)
      : host_(dataset, std::move(options)), device_(host_, exec.stream()) {}
  BatchLoader(Dataset&&, LoaderOptions, auto&) = delete;  // the loader keeps a pointer to the dataset

  void start_epoch(index_t epoch, index_t first_batch = 0) { device_.start_epoch(epoch, first_batch); }
  const DeviceBatch* next() { return device_.next(); }
  index_t batches_per_epoch() const { return host_.batches_per_epoch(); }
  index_t batch_size() const { return host_.batch_size(); }
  index_t epoch() const { return host_.epoch(); }
  // Batches handed out by next() this epoch: the host loader runs one batch ahead (staging).
  index_t batches_taken() const { return device_.batches_taken(); }
  double wait_seconds() const { return device_.wait_seconds(); }

 private:
  Loader host_;
  DeviceLoader device_;
};

}  // namespace kiln::data

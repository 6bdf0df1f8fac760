// kiln/dist/nccl.cuh — collectives on device memory between the ranks of a job, on NCCL:
// all-reduce (sum, average), broadcast and all-gather, queued on a CUDA stream like any kernel.
//
// Set-up: each rank takes the device numbered by its rank on the node (use_local_device; more
// ranks than devices on a node is an error naming both counts), rank 0 asks NCCL for a unique id,
// the ProcessGroup carries it to every rank (MPI's broadcast under mpirun, the TCP rendezvous
// under torchrun), and every rank joins the communicator.
//
// Failure: a call NCCL refuses is a DistError naming the collective, the rank and NCCL's message
// (ncclGetErrorString and ncclGetLastError). A collective that never ends — a rank died, or never
// came — must not hang the others: every collective this group queues is watched by a thread
// that polls its completion and NCCL's asynchronous error (ncclCommGetAsyncError); an error, or
// a collective still running after the timeout (KILN_DIST_TIMEOUT, 300 s), aborts the
// communicator (ncclCommAbort, which ends its kernels, as PyTorch's watchdog does), says so on
// stderr at once (the main thread may be waiting on the stream), and every later call of the
// group throws that DistError.
//
// Without NCCL at build time (KILN_HAVE_NCCL 0: CMake did not find nccl.h and libnccl) the class
// still compiles, and making one says how to get NCCL.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

#include "kiln/backend/cuda/check.cuh"
#include "kiln/config.hpp"
#include "kiln/dist/dist_error.hpp"
#include "kiln/dist/process_group.hpp"

#ifndef KILN_HAVE_NCCL
#define KILN_HAVE_NCCL 0  // CMake defines it to 1 on kiln::cuda where it found NCCL
#endif
#if KILN_HAVE_NCCL
#include <nccl.h>
#endif

namespace kiln::dist {

// Makes the device numbered by this rank's place on its node current; returns its number.
// throws: DistError when the node runs more ranks than it has devices (naming both counts).
inline int use_local_device(const ProcessGroup& group) {
  int devices = 0;
  KILN_CUDA_CHECK(cudaGetDeviceCount(&devices));
  check_devices_per_node(group.local_size(), devices);
  KILN_CUDA_CHECK(cudaSetDevice(group.local_rank()));
  return group.local_rank();
}

class NcclGroup {
 public:
  // A communicator over `group`'s ranks on the current device (call use_local_device first).
  // timeout_seconds 0: dist::timeout_seconds().
  // throws: DistError when NCCL is missing from the build or refuses.
  explicit NcclGroup(ProcessGroup& group, double timeout_seconds = 0)
      : rank_(group.rank()),
        size_(group.size()),
        timeout_(timeout_seconds > 0 ? timeout_seconds : dist::timeout_seconds()) {
#if KILN_HAVE_NCCL
    KILN_CUDA_CHECK(cudaGetDevice(&device_));
    // One rank talks to no one, but NCCL's bootstrap still opens sockets on the interfaces it
    // finds, and ncclCommInitRank blocks — before any watchdog runs — where one of them does not
    // answer (seen in sandboxes and VMs). The loopback always does: chosen unless the user chose.
    if (size_ == 1) ::setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
    ncclUniqueId id{};
    if (rank_ == 0) check("ncclGetUniqueId", 0, ncclGetUniqueId(&id));
    group.share_from_root(&id, sizeof id);
    check("ncclCommInitRank", 0, ncclCommInitRank(&comm_, size_, id, rank_));
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&setup_stream_, cudaStreamNonBlocking));
    watchdog_ = std::thread([this] { watch_loop(); });
#else
    (void)group;
    throw DistError(
        "kiln::dist: collectives on device memory need NCCL, and this build has none; install NCCL (nccl.h and "
        "libnccl, e.g. Debian's libnccl-dev, or the CUDA toolkit's) and configure again");
#endif
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
#if KILN_HAVE_NCCL
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    for (Pending& p : pending_) (void)cudaEventDestroy(p.done);
    if (comm_ != nullptr && !failed_) {
      (void)ncclCommFinalize(comm_);  // waits for the collectives still queued
      (void)ncclCommDestroy(comm_);
    }
    if (setup_stream_ != nullptr) (void)cudaStreamDestroy(setup_stream_);
#endif
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  // "rank 1 of 2 (nccl)".
  std::string describe() const { return ::kiln::detail::concat("rank ", rank_, " of ", size_, " (nccl)"); }

  // data[0, n) on device, on every rank, becomes the element-wise sum (or average) over the ranks;
  // queued on `stream`.
  template <class T>
  void all_reduce(T* data, index_t n, ReduceOp op, cudaStream_t stream) {
#if KILN_HAVE_NCCL
    require_open("all_reduce", n);
    check("all_reduce", n,
          ncclAllReduce(data, data, std::size_t(n), nccl_type<T>(), op == ReduceOp::average ? ncclAvg : ncclSum,
                        comm_, stream));
#else
    (void)data, (void)n, (void)op, (void)stream;
#endif
  }

  // data[0, n) on device, on every rank, becomes root's; queued on `stream`.
  template <class T>
  void broadcast(T* data, index_t n, int root, cudaStream_t stream) {
    static_assert(std::is_trivially_copyable_v<T>, "kiln::dist::NcclGroup::broadcast copies bytes");
    KILN_CHECK(root >= 0 && root < size_, DistError, "kiln::dist: broadcast from rank ", root, " in a group of ", size_);
#if KILN_HAVE_NCCL
    require_open("broadcast", n);
    check("broadcast", n, ncclBroadcast(data, data, std::size_t(n) * sizeof(T), ncclUint8, root, comm_, stream));
#else
    (void)data, (void)n, (void)stream;
#endif
  }

  // out[r * n, (r + 1) * n) on device becomes rank r's in[0, n), on every rank; queued on `stream`.
  template <class T>
  void all_gather(const T* in, index_t n, T* out, cudaStream_t stream) {
    static_assert(std::is_trivially_copyable_v<T>, "kiln::dist::NcclGroup::all_gather copies bytes");
#if KILN_HAVE_NCCL
    require_open("all_gather", n);
    check("all_gather", n, ncclAllGather(in, out, std::size_t(n) * sizeof(T), ncclUint8, comm_, stream));
#else
    (void)in, (void)n, (void)out, (void)stream;
#endif
  }

  // The collectives `queue()` issues go as one (ncclGroupStart / ncclGroupEnd): NCCL fuses them
  // into as few kernels as it can (a bucket's all-reduces, a model's broadcasts).
  template <class F>
  void batched(F&& queue) {
#if KILN_HAVE_NCCL
    check("ncclGroupStart", 0, ncclGroupStart());
    try {
      queue();
    } catch (...) {
      (void)ncclGroupEnd();
      throw;
    }
    check("ncclGroupEnd", 0, ncclGroupEnd());
#else
    queue();
#endif
  }

  // The watchdog keeps an eye on what `stream` holds now (see the file comment); `what` names it.
  void watch(cudaStream_t stream, const char* what) {
#if KILN_HAVE_NCCL
    cudaEvent_t done = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventRecord(done, stream));
    {
      std::lock_guard lock(mutex_);
      pending_.push_back({done, what, Clock::now() + seconds(timeout_)});
    }
    wake_.notify_one();
#else
    (void)stream, (void)what;
#endif
  }

  // Waits on the host for what `stream` holds now, at most the timeout.
  // throws: DistError when the communicator failed or was aborted meanwhile.
  void wait(cudaStream_t stream, const char* what) {
    watch(stream, what);
    for (;;) {
      require_open(what, 0);
      const cudaError_t state = cudaStreamQuery(stream);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) KILN_CUDA_CHECK(state);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Host values through the device, waited for: what the set-up's checks exchange (parameter
  // counts and sizes) and what a program sums now and then (an epoch's loss, a throughput) in a
  // job whose ProcessGroup has no host collectives (torchrun's).
  // all_gather_host: out (size() * n values) gets every rank's in[0, n).
  void all_gather_host(const std::int64_t* in, index_t n, std::int64_t* out) {
    through_device<std::int64_t>(n * (size_ + 1), [&](std::int64_t* device) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(device, in, bytes_of<std::int64_t>(n), cudaMemcpyHostToDevice, setup_stream_));
      all_gather(device, n, device + n, setup_stream_);
      KILN_CUDA_CHECK(cudaMemcpyAsync(out, device + n, bytes_of<std::int64_t>(n * size_), cudaMemcpyDeviceToHost,
                                      setup_stream_));
      wait(setup_stream_, "all_gather of host values");
    });
  }
  // all_reduce_host: data[0, n) becomes the sum (or average) over the ranks.
  template <class T>
  void all_reduce_host(T* data, index_t n, ReduceOp op = ReduceOp::sum) {
    through_device<T>(n, [&](T* device) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(device, data, bytes_of<T>(n), cudaMemcpyHostToDevice, setup_stream_));
      all_reduce(device, n, op, setup_stream_);
      KILN_CUDA_CHECK(cudaMemcpyAsync(data, device, bytes_of<T>(n), cudaMemcpyDeviceToHost, setup_stream_));
      wait(setup_stream_, "all_reduce of host values");
    });
  }

  // Whether the watchdog aborted the communicator (then every call throws).
  bool failed() const { return failed_; }

 private:
  using Clock = std::chrono::steady_clock;
  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  template <class T>
  static std::size_t bytes_of(index_t n) {
    return std::size_t(n) * sizeof(T);
  }
  // Runs use(buffer) on a scratch buffer of n Ts on the device, freed after (set-up work only).
  template <class T, class Use>
  void through_device(index_t n, Use&& use) {
    void* device = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&device, bytes_of<T>(n) + 1));
    try {
      use(static_cast<T*>(device));
    } catch (...) {
      (void)cudaStreamSynchronize(setup_stream_);
      (void)cudaFree(device);
      throw;
    }
    KILN_CUDA_CHECK(cudaFree(device));
  }

  void require_open(const char* what, index_t n) const {
    if (!failed_) return;
    std::lock_guard lock(mutex_);
    throw DistError(::kiln::detail::concat("kiln::dist: ", what, " of ", n, " elements on ", describe(),
                                           ": the communicator was aborted: ", failure_));
  }

#if KILN_HAVE_NCCL
  template <class T>
  static ncclDataType_t nccl_type() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
                      std::is_same_v<T, std::int64_t>,
                  "kiln::dist::NcclGroup::all_reduce sums float, double, int32 or int64 elements");
    if constexpr (std::is_same_v<T, float>) return ncclFloat32;
    else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
    else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
    else return ncclInt64;
  }

  void check(const char* what, index_t n, ncclResult_t status) const {
    if (status == ncclSuccess) return;
    const char* last = ncclGetLastError(comm_);
    throw DistError(::kiln::detail::concat("kiln::dist: ", what, " of ", n, " elements on ", describe(),
                                           " failed: NCCL: ", ncclGetErrorString(status),
                                           last != nullptr && *last != '\0' ? " (" : "",
                                           last != nullptr ? last : "", last != nullptr && *last != '\0' ? ")" : ""));
  }

  // The watchdog: retires finished collectives; on NCCL's asynchronous error or a collective past
  // its deadline, aborts the communicator.
  void watch_loop() {
    (void)cudaSetDevice(device_);
    std::unique_lock lock(mutex_);
    for (;;) {
      if (pending_.empty()) wake_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      else wake_.wait_for(lock, std::chrono::milliseconds(1), [&] { return stop_; });
      if (stop_ || failed_) return;
      while (!pending_.empty() && cudaEventQuery(pending_.front().done) == cudaSuccess) {
        (void)cudaEventDestroy(pending_.front().done);
        pending_.pop_front();
      }
      ncclResult_t async = ncclSuccess;
      (void)ncclCommGetAsyncError(comm_, &async);
      std::string why;
      if (async != ncclSuccess && async != ncclInProgress)
        why = ::kiln::detail::concat("NCCL reported an error: ", ncclGetErrorString(async));
      else if (!pending_.empty() && Clock::now() > pending_.front().deadline)
        why = ::kiln::detail::concat(pending_.front().what, " did not finish within ", timeout_,
                                     " s (KILN_DIST_TIMEOUT); another rank may have died or stopped calling it");
      if (why.empty()) continue;
      failure_ = why;
      failed_ = true;
      std::fprintf(stderr, "kiln::dist: %s: %s; aborting the NCCL communicator\n", describe().c_str(), why.c_str());
      std::fflush(stderr);
      (void)ncclCommAbort(comm_);  // ends the communicator's kernels, so waits on the streams return
      return;
    }
  }

  ncclComm_t comm_ = nullptr;
#endif

  struct Pending {
    cudaEvent_t done;
    const char* what;
    Clock::time_point deadline;
  };

  int rank_, size_, device_ = 0;
  double timeout_;
  cudaStream_t setup_stream_ = nullptr;
  std::thread watchdog_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  bool stop_ = false;
  std::atomic<bool> failed_{false};
  std::string failure_;
};

}  // namespace kiln::dist

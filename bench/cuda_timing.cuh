// bench/cuda_timing.cuh — what the CUDA benchmarks share for timing device work and for the
// references they compare against (a device-to-device copy, a plain cuBLASLt GEMM).
//
// GpuTimer::block(enqueue) measures the device time of the work enqueue() queues on one
// stream: a one-thread kernel first holds the stream (it waits on a flag in mapped host
// memory), the host queues event A, the work and event B, then releases the hold. So the work
// runs back to back however slowly the host queued it, and the events see device time only —
// not launch gaps (what nvbench's "blocking kernel" does). If queuing takes longer than the hold's
// timeout (0.2 s: the host waited on the device inside enqueue, e.g. a cudaMalloc), the kernel
// lets go early and the timer remembers it: host_gaps() is then true and the benchmark says so.
//
// Bytes: a kernel's "bytes" are what it must read plus what it must write (each operand once);
// the copy reference for it is cudaMemcpyAsync device-to-device of bytes / 2 on the same stream,
// which reads bytes / 2 and writes bytes / 2 — the same traffic. fraction_of_copy is
// copy seconds / kernel seconds (1.0: the kernel moves its bytes as fast as the copy engine
// path does). Same-size working sets, so both see the same L2 (50 MB on an H200): data that fits
// is timed L2-resident for both.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <map>
#include <vector>

#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/device.cuh"
#include "timing.hpp"

namespace kiln_bench {

namespace cuda_detail {

__device__ inline unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Waits until *release != 0, or timeout_ns have passed (then sets *timed_out).
__global__ void hold_stream(const volatile int* release, volatile int* timed_out, unsigned long long timeout_ns) {
  const unsigned long long t0 = global_ns();
  while (*release == 0) {
    if (global_ns() - t0 > timeout_ns) {
      *timed_out = 1;
      return;
    }
    __nanosleep(500);
  }
}

}  // namespace cuda_detail

class GpuTimer {
 public:
  explicit GpuTimer(cudaStream_t stream, double timeout_s = 0.2)
      : stream_(stream), timeout_ns_(static_cast<unsigned long long>(timeout_s * 1e9)) {
    KILN_CUDA_CHECK(cudaEventCreate(&a_));
    KILN_CUDA_CHECK(cudaEventCreate(&b_));
    KILN_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&flags_), 2 * sizeof(int), cudaHostAllocMapped));
    flags_[0] = flags_[1] = 0;
    KILN_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dflags_), flags_, 0));
  }
  ~GpuTimer() {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaEventDestroy(a_);
    (void)cudaEventDestroy(b_);
    (void)cudaFreeHost(flags_);
  }
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  // Device seconds of what enqueue() queues on the stream (see the file comment).
  template <class F>
  double block(F&& enqueue) {
    volatile int* f = flags_;
    f[0] = 0;
    f[1] = 0;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    cuda_detail::hold_stream<<<1, 1, 0, stream_>>>(dflags_, dflags_ + 1, timeout_ns_);
    KILN_CUDA_CHECK(cudaGetLastError());
    KILN_CUDA_CHECK(cudaEventRecord(a_, stream_));
    enqueue();
    KILN_CUDA_CHECK(cudaEventRecord(b_, stream_));
    std::atomic_thread_fence(std::memory_order_seq_cst);
    f[0] = 1;
    KILN_CUDA_CHECK(cudaEventSynchronize(b_));
    if (f[1] != 0) host_gaps_ = true;
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a_, b_));
    return double(ms) * 1e-3;
  }

  // Median device seconds per call: `warmup` untimed calls (then a synchronisation), then
  // `reps` blocks of `calls` calls each. prepare(calls) runs before each block's hold (it may
  // queue work of its own, e.g. the forwards whose backwards call() times); call(i) for
  // i = 0 .. calls-1 is what is timed.
  template <class Prepare, class Call>
  double per_call(int warmup, int reps, int calls, Prepare&& prepare, Call&& call) {
    for (int w = 0; w < warmup; ++w) {
      prepare(1);
      call(0);
    }
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      prepare(calls);
      t.push_back(block([&] {
                    for (int i = 0; i < calls; ++i) call(i);
                  }) /
                  calls);
    }
    return median(t);
  }
  template <class Call>
  double per_call(int warmup, int reps, int calls, Call&& call) {
    return per_call(warmup, reps, calls, [](int) {}, call);
  }

  // Calls per block so that a block takes about target_s of device time (from one timed call;
  // at least 1, at most max_calls): short kernels are timed over many calls, long ones once.
  template <class Prepare, class Call>
  int calls_for(double target_s, int max_calls, Prepare&& prepare, Call&& call) {
    prepare(1);
    call(0);  // warm: plans, workspaces, the allocator's cache
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    prepare(1);
    const double one = block([&] { call(0); });
    return std::clamp(int(target_s / std::max(one, 1e-7)), 1, max_calls);
  }

  bool host_gaps() const { return host_gaps_; }
  void reset_host_gaps() { host_gaps_ = false; }
  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_;
  unsigned long long timeout_ns_;
  cudaEvent_t a_{}, b_{};
  int* flags_ = nullptr;   // [0]: release, [1]: the hold timed out (host view)
  int* dflags_ = nullptr;  // the same two ints, device view
  bool host_gaps_ = false;
};

// Device-to-device copies of the benchmark's byte counts on the timer's stream, each measured
// once per process and remembered. Its buffers grow to the largest request.
class CopyReference {
 public:
  explicit CopyReference(GpuTimer& timer, int reps = 11) : timer_(timer), reps_(reps) {}
  ~CopyReference() { release(); }
  CopyReference(const CopyReference&) = delete;
  CopyReference& operator=(const CopyReference&) = delete;

  // Sizes the buffers for copies of up to `moved` bytes moved (avoids regrowing them later).
  void reserve(std::size_t moved) { grow(std::max<std::size_t>(moved / 2, 4)); }

  // Seconds of cudaMemcpyAsync device-to-device of moved / 2 bytes (moved = read + written).
  double seconds(std::size_t moved) {
    const std::size_t half = std::max<std::size_t>(moved / 2, 4);
    if (auto it = seconds_.find(half); it != seconds_.end()) return it->second;
    grow(half);
    auto copy = [&](int) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(dst_, src_, half, cudaMemcpyDeviceToDevice, timer_.stream()));
    };
    const int calls = timer_.calls_for(2e-3, 50, [](int) {}, copy);
    const double s = timer_.per_call(2, reps_, calls, copy);
    seconds_[half] = s;
    return s;
  }
  double gbps(std::size_t moved) { return double(moved) / seconds(moved) * 1e-9; }

 private:
  void grow(std::size_t half) {
    if (half > capacity_) {
      release();
      KILN_CUDA_CHECK(cudaMalloc(&src_, half));
      KILN_CUDA_CHECK(cudaMalloc(&dst_, half));
      KILN_CUDA_CHECK(cudaMemsetAsync(src_, 0, half, timer_.stream()));
      capacity_ = half;
    }
  }
  void release() {
    if (src_ || dst_) (void)cudaDeviceSynchronize();
    if (src_) (void)cudaFree(src_);
    if (dst_) (void)cudaFree(dst_);
    src_ = dst_ = nullptr;
    capacity_ = 0;
  }
  GpuTimer& timer_;
  int reps_;
  void* src_ = nullptr;
  void* dst_ = nullptr;
  std::size_t capacity_ = 0;
  std::map<std::size_t, double> seconds_;
};

// The device's L2 size in bytes (0 when unknown), printed beside L2-sized working sets.
inline long long l2_bytes() {
  int device = 0, l2 = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device) != cudaSuccess)
    return 0;
  return l2;
}

}  // namespace kiln_bench

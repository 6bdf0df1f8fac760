// kiln/backend/cuda/device.cuh — is there a usable CUDA device, and if not, why not.
//
// Test runners and examples ask this first and skip with the reason instead of failing (unless
// KILN_REQUIRE_DEVICE asks for a device: device_required(), report_no_device()): on a
// machine without a GPU (or with a driver older than the runtime) cudaGetDeviceCount returns an
// error rather than zero devices, so any error counts as "no device".
//
// ensures: none of these functions throws; the probe runs once per process (thread-safe) and
// leaves no pending error behind for later cudaGetLastError() checks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "kiln/core/device_required.hpp"

namespace kiln::cu {

namespace detail {

struct DeviceProbe {
  bool available = false;
  std::string reason;  // empty when available
  std::string name;    // empty when not available
};

inline DeviceProbe probe_device() noexcept {
  DeviceProbe probe;
  try {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // the probe's failure must not surface in a later check
      probe.reason = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
      return probe;
    }
    if (count <= 0) {
      probe.reason = "cudaGetDeviceCount found 0 devices";
      return probe;
    }
    int device = 0;
    cudaDeviceProp prop{};
    cudaError_t prop_status = cudaGetDevice(&device);
    if (prop_status == cudaSuccess) prop_status = cudaGetDeviceProperties(&prop, device);
    if (prop_status != cudaSuccess) {
      (void)cudaGetLastError();
      probe.reason = std::string("device properties unavailable: ") +
                     cudaGetErrorName(prop_status) + ": " + cudaGetErrorString(prop_status);
      return probe;
    }
    probe.available = true;
    probe.name = prop.name;
  } catch (...) {  // only std::bad_alloc from the strings; "no device" is the safe answer
    probe.available = false;
  }
  return probe;
}

inline const DeviceProbe& device_probe() noexcept {
  static const DeviceProbe probe = probe_device();
  return probe;
}

}  // namespace detail

// True when at least one CUDA device answers.
inline bool device_available() noexcept { return detail::device_probe().available; }

// Why device_available() is false (the runtime's error name and text); empty when it is true.
inline std::string device_unavailable_reason() noexcept {
  try {
    return detail::device_probe().reason;
  } catch (...) {
    return {};
  }
}

// The current device's name (e.g. "NVIDIA H200"); empty when no device is available.
inline std::string device_name() noexcept {
  try {
    return detail::device_probe().name;
  } catch (...) {
    return {};
  }
}

using kiln::device_required;  // KILN_REQUIRE_DEVICE (kiln/core/device_required.hpp)

// For a program that found no usable device: prints why, as a skip ("<program>: skipped — no
// CUDA device (<reason>)") and returns 0, or, when device_required(), as a failure on stderr and
// returns 2. Use as `if (!kiln::cu::device_available()) return kiln::cu::report_no_device("x");`.
inline int report_no_device(const char* program) noexcept {
  const std::string reason = device_unavailable_reason();
  if (device_required()) {
    std::fprintf(stderr, "%s: FAILED — KILN_REQUIRE_DEVICE is set and there is no usable CUDA device (%s)\n",
                 program, reason.c_str());
    return 2;
  }
  std::printf("%s: skipped — no CUDA device (%s)\n", program, reason.c_str());
  return 0;
}

}  // namespace kiln::cu

// kiln/core/device_required.hpp — whether the environment asks for a CUDA device.
//
// KILN_REQUIRE_DEVICE set to anything but "" or "0" (the GPU check script sets it): a program
// that would skip its CUDA work, or fall back to the CPU, for want of a usable device fails
// instead, so a check run cannot pass having run nothing. Host-only, so host-only builds of the
// examples can answer it too (they fail: they have no CUDA at all).
#pragma once

#include <cstdlib>
#include <string_view>

namespace kiln {

inline bool device_required() noexcept {
  const char* v = std::getenv("KILN_REQUIRE_DEVICE");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

}  // namespace kiln

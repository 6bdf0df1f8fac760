// kiln/core/warning.hpp — warnings: things that are legal but almost always a mistake (a tape
// that keeps growing because results are computed outside NoGrad, ...).
//
// By default a warning is one line on stderr, "kiln warning: <message>". A program (or a test)
// can route them elsewhere with set_warning_handler; each warning site decides how often it
// speaks (the tape's growth warning: once per tape).
#pragma once

#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <utility>

namespace kiln {

using WarningHandler = std::function<void(const std::string& message)>;

namespace detail {
struct WarningSink {
  std::mutex mutex;
  WarningHandler handler;  // empty: stderr
};
inline WarningSink& warning_sink() {
  static WarningSink sink;
  return sink;
}
}  // namespace detail

// Sends warnings to `handler` (an empty one restores stderr); returns the previous handler.
inline WarningHandler set_warning_handler(WarningHandler handler) {
  auto& sink = detail::warning_sink();
  std::lock_guard<std::mutex> lock(sink.mutex);
  return std::exchange(sink.handler, std::move(handler));
}

inline void warn(const std::string& message) {
  auto& sink = detail::warning_sink();
  std::lock_guard<std::mutex> lock(sink.mutex);
  if (sink.handler) sink.handler(message);
  else std::fprintf(stderr, "kiln warning: %s\n", message.c_str());
}

}  // namespace kiln

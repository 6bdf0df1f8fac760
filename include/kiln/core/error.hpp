// kiln/core/error.hpp — one exception family; messages say what was wrong.
//
// Checks made with KILN_CHECK stay on in release builds: a wrong shape must never turn into a
// silent out-of-bounds read.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

// Root of every error kiln throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Shapes or extents that do not fit together (elementwise, matmul, layers).
class ShapeError : public Error {
 public:
  using Error::Error;
};

// A value outside its allowed range (an argument, an option, a label).
class ValueError : public Error {
 public:
  using Error::Error;
};

// An aliasing assignment that would read data it has already overwritten.
class AliasError : public Error {
 public:
  using Error::Error;
};

// A failed CUDA runtime, cuBLAS(Lt), cuDNN or CUB call; the message names the call and status.
class CudaError : public Error {
 public:
  using Error::Error;
};

// A device allocation that failed; the message states requested, in-use and cached bytes.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// A malformed data file; the message names the file and the byte offset (or line).
class DataError : public Error {
 public:
  using Error::Error;
};

// Training diverged (NaN / inf loss) or another numeric failure at run time.
class NumericError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// A failed KILN_CHECK: the message is built and thrown out of line, so a check costs its caller
// one compare and one call. The parts are taken by value: string literals decay to const char*,
// so every check with the same kinds of parts shares one instantiation.
template <class ErrorType, class... Parts>
[[noreturn, gnu::noinline, gnu::cold]] void fail(Parts... parts) {
  throw ErrorType(concat(parts...));
}
}  // namespace detail

}  // namespace kiln

// KILN_CHECK(cond, ErrorType, parts...): throws ErrorType with the streamed parts when cond is
// false. Always on, also with NDEBUG.
#define KILN_CHECK(cond, ErrorType, ...)                                      \
  do {                                                                        \
    if (!(cond)) [[unlikely]] ::kiln::detail::fail<ErrorType>(__VA_ARGS__); \
  } while (0)

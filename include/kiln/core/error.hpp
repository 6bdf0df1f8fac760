// kiln/core/error.hpp — one exception family; messages say what was wrong.
//
// Checks made with KILN_CHECK stay on in release builds: a wrong shape must never turn into a
// silent out-of-bounds read.
#pragma once

#include <charconv>
#include <cstdio>
#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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

// One piece of an error message. Strings, characters, integers and floating-point numbers are
// formatted by one function (join_message), as std::ostream would format them; anything else (a
// Shape, an enum with operator<<, a path) through a stream, once per type; a stream manipulator
// (std::hex) makes join_message write the whole message through one stream, as `<<` would. So a
// message costs its check one small array, not an ostringstream per set of argument types:
// kiln has hundreds of checks, and a stream per check was a measurable part of every program's
// compile time.
class MessagePart {
 public:
  enum class Kind : unsigned char { text, character, signed_int, unsigned_int, real, manipulator, object };
  using Manipulator = std::ios_base& (*)(std::ios_base&);

  MessagePart(const char* s) : MessagePart(s ? std::string_view(s) : std::string_view("(null)")) {}
  MessagePart(std::string_view s) : text_{s.data(), s.size()} {}
  MessagePart(const std::string& s) : MessagePart(std::string_view(s)) {}
  MessagePart(char c) : kind_(Kind::character), character_(c) {}
  MessagePart(signed char c) : kind_(Kind::character), character_(char(c)) {}
  MessagePart(unsigned char c) : kind_(Kind::character), character_(char(c)) {}
  MessagePart(bool b) : kind_(Kind::signed_int), signed_(b) {}
  template <class I>
    requires(std::is_integral_v<I> && std::is_signed_v<I>)
  MessagePart(I v) : kind_(Kind::signed_int), bytes_(sizeof(I)), signed_(v) {}
  template <class I>
    requires(std::is_integral_v<I> && std::is_unsigned_v<I>)
  MessagePart(I v) : kind_(Kind::unsigned_int), bytes_(sizeof(I)), unsigned_(v) {}
  MessagePart(Manipulator m) : kind_(Kind::manipulator), manipulator_(m) {}
  MessagePart(float v) : kind_(Kind::real), real_(v) {}
  MessagePart(double v) : kind_(Kind::real), real_(v) {}
  MessagePart(long double v) : kind_(Kind::real), real_(double(v)) {}
  // Anything else (a Shape, a path, an enum): written by its operator<< when the message is
  // joined. The part refers to x, which outlives it (a message is joined within the call that
  // made its parts).
  template <class X>
    requires(!std::is_arithmetic_v<X> && !std::is_convertible_v<const X&, std::string_view>)
  MessagePart(const X& x) : kind_(Kind::object), object_{&x, &stream_object<X>} {}
  MessagePart(const MessagePart&) = delete;
  MessagePart& operator=(const MessagePart&) = delete;

  // Appends this part as std::ostream's operator<< would write it (default flags, precision 6).
  void append_to(std::string& out) const {
    char buf[32];
    switch (kind_) {
      case Kind::text: out.append(text_.data, text_.size); return;
      case Kind::character: out += character_; return;
      case Kind::signed_int: out.append(buf, std::to_chars(buf, buf + sizeof buf, signed_).ptr); return;
      case Kind::unsigned_int: out.append(buf, std::to_chars(buf, buf + sizeof buf, unsigned_).ptr); return;
      case Kind::real: out.append(buf, std::size_t(std::snprintf(buf, sizeof buf, "%g", real_))); return;
      case Kind::manipulator: return;
      case Kind::object: {
        std::ostringstream s;
        object_.write(object_.x, s);
        out += s.str();
        return;
      }
    }
  }
  bool is_manipulator() const { return kind_ == Kind::manipulator; }
  // Writes this part with `<<` (integers in their own width, for std::hex of a negative value).
  void stream_to(std::ostream& out) const {
    switch (kind_) {
      case Kind::text: out << std::string_view(text_.data, text_.size); return;
      case Kind::character: out << character_; return;
      case Kind::signed_int:
        if (bytes_ == 2) out << short(signed_);
        else if (bytes_ == 4) out << int(signed_);
        else out << signed_;
        return;
      case Kind::unsigned_int:
        if (bytes_ == 2) out << static_cast<unsigned short>(unsigned_);
        else if (bytes_ == 4) out << unsigned(unsigned_);
        else out << unsigned_;
        return;
      case Kind::real: out << real_; return;
      case Kind::manipulator: out << manipulator_; return;
      case Kind::object: object_.write(object_.x, out); return;
    }
  }

 private:
  template <class X>
  static void stream_object(const void* x, std::ostream& out) {
    out << *static_cast<const X*>(x);
  }

  // Trivially destructible, a few stores to make: a check's message array costs its caller
  // nearly nothing to build and nothing to destroy.
  Kind kind_ = Kind::text;
  unsigned char bytes_ = 8;  // an integer's size
  union {
    struct {
      const char* data;
      std::size_t size;
    } text_;
    char character_;
    long long signed_;
    unsigned long long unsigned_;
    double real_;
    Manipulator manipulator_;
    struct {
      const void* x;
      void (*write)(const void*, std::ostream&);
    } object_;
  };
};

inline std::string join_message(const MessagePart* parts, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    if (!parts[i].is_manipulator()) continue;
    std::ostringstream stream;  // a manipulator changes how the parts after it read
    for (std::size_t j = 0; j < count; ++j) parts[j].stream_to(stream);
    return stream.str();
  }
  std::string out;
  for (std::size_t i = 0; i < count; ++i) parts[i].append_to(out);
  return out;
}

// The parts written one after another, as `(stream << ... << parts)` would.
template <class... Parts>
std::string concat(const Parts&... parts) {
  if constexpr (sizeof...(Parts) == 0) {
    return {};
  } else {
    const MessagePart list[] = {MessagePart(parts)...};
    return join_message(list, sizeof...(Parts));
  }
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

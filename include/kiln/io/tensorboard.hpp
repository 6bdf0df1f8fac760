// kiln/io/tensorboard.hpp — TensorBoard event files without TensorFlow: an `Event` protobuf per
// record (TFRecord framing, io/tfrecord.hpp), encoded by hand — the handful of fields a scalar
// log needs is smaller than a protobuf dependency. TensorBoard's own reader loads the files
// (tests/cpu/test_tensorboard.cpp decodes them here; scripts/read_tensorboard.py with TensorBoard).
//
//   kiln::io::EventWriter events("runs/mlp");            // runs/mlp/events.out.tfevents.<time>.<host>.<pid>
//   events.write_scalars(step, {{"train/loss", 0.31}, {"train/lr", 1e-3}});
//
// The fields written (tensorflow/core/util/event.proto, summary.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/io/atomic_file.hpp"
#include "kiln/io/tfrecord.hpp"

namespace kiln::io {

// One named value of a log line.
struct Scalar {
  std::string tag;
  double value = 0;
};

// What an Event record holds, as far as kiln writes it (decode_event's result).
struct Event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string file_version;  // set on the first record of a file only
  std::vector<std::pair<std::string, float>> scalars;
};

namespace protobuf {
enum class Wire : std::uint32_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };
constexpr std::uint64_t key(std::uint32_t field, Wire wire) { return (std::uint64_t(field) << 3) | std::uint64_t(wire); }

KILN_COMPILED void put_varint(std::string& out, std::uint64_t v);
inline void put_key(std::string& out, std::uint32_t field, Wire wire) { put_varint(out, key(field, wire)); }
KILN_COMPILED void put_bytes(std::string& out, std::uint32_t field, std::string_view s);
template <class T>
void put_fixed(std::string& out, std::uint32_t field, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "protobuf fixed fields are 4 or 8 bytes");
  put_key(out, field, sizeof(T) == 4 ? Wire::fixed32 : Wire::fixed64);
  unsigned char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // little-endian hosts only, as is all of kiln's I/O
  out.append(reinterpret_cast<const char*>(raw), sizeof(T));
}

// A bounds-checked walk over one message's fields; unknown fields are skipped.
class Reader {
 public:
  explicit Reader(std::string_view msg) : msg_(msg) {}
  bool done() const { return at_ >= msg_.size(); }
  std::uint64_t varint();
  std::string_view take(std::size_t n);
  template <class T>
  T fixed() {
    T v;
    std::memcpy(&v, take(sizeof(T)).data(), sizeof(T));
    return v;
  }
  void skip(Wire wire);

 private:
  std::string_view msg_;
  std::size_t at_ = 0;
};
}  // namespace protobuf

// The serialized Event of one summary line (or, with no scalars and a version, the file header).
KILN_COMPILED std::string encode_event(double wall_time, std::int64_t step, const std::vector<Scalar>& scalars,
                                       std::string_view file_version = {});

// Decodes an Event record (the fields above; others skipped).
// throws: DataError when the bytes are not a well-formed message.
KILN_COMPILED Event decode_event(std::string_view bytes);

// Appends Event records to a new events.out.tfevents.* file in `dir` (created if missing). Each
// record goes out in one write(2): a killed run leaves whole records behind it (TensorBoard reads
// up to a torn last one).
class EventWriter {
 public:
  explicit EventWriter(const std::string& dir);
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  ~EventWriter();

  const std::string& path() const { return path_; }

  // One Event at `step` holding every scalar (TensorBoard keys its charts by tag).
  void write_scalars(std::int64_t step, const std::vector<Scalar>& scalars);

 private:
  void append(std::string_view event);

  std::string path_;
  int fd_ = -1;
};

}  // namespace kiln::io

#if KILN_HEADER_BODIES
#include "kiln/io/tensorboard_bodies.hpp"
#endif

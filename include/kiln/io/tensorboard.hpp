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

inline void put_varint(std::string& out, std::uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(char((v & 0x7Fu) | 0x80u));
  out.push_back(char(v));
}
inline void put_key(std::string& out, std::uint32_t field, Wire wire) { put_varint(out, key(field, wire)); }
inline void put_bytes(std::string& out, std::uint32_t field, std::string_view s) {
  put_key(out, field, Wire::length_delimited);
  put_varint(out, s.size());
  out.append(s);
}
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
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      KILN_CHECK(at_ < msg_.size(), DataError, "protobuf: varint runs past the message end");
      const auto b = static_cast<unsigned char>(msg_[at_++]);
      v |= std::uint64_t(b & 0x7Fu) << shift;
      if (!(b & 0x80u)) return v;
    }
    throw DataError("protobuf: varint longer than 10 bytes");
  }
  std::string_view take(std::size_t n) {
    KILN_CHECK(n <= msg_.size() - at_, DataError, "protobuf: field of ", n, " bytes runs past the message end");
    const auto s = msg_.substr(at_, n);
    at_ += n;
    return s;
  }
  template <class T>
  T fixed() {
    T v;
    std::memcpy(&v, take(sizeof(T)).data(), sizeof(T));
    return v;
  }
  void skip(Wire wire) {
    switch (wire) {
      case Wire::varint: varint(); return;
      case Wire::fixed64: take(8); return;
      case Wire::length_delimited: take(std::size_t(varint())); return;
      case Wire::fixed32: take(4); return;
    }
    throw DataError("protobuf: unsupported wire type " + std::to_string(unsigned(wire)));
  }

 private:
  std::string_view msg_;
  std::size_t at_ = 0;
};
}  // namespace protobuf

// The serialized Event of one summary line (or, with no scalars and a version, the file header).
inline std::string encode_event(double wall_time, std::int64_t step, const std::vector<Scalar>& scalars,
                                std::string_view file_version = {}) {
  using namespace protobuf;
  std::string event;
  put_fixed(event, 1, wall_time);
  if (step != 0) {  // proto3 leaves a field at its default out, as TensorBoard's writer does
    put_key(event, 2, Wire::varint);
    put_varint(event, std::uint64_t(step));
  }
  if (!file_version.empty()) put_bytes(event, 3, file_version);
  if (!scalars.empty()) {
    std::string summary;
    for (const Scalar& s : scalars) {
      std::string value;
      put_bytes(value, 1, s.tag);
      put_fixed(value, 2, float(s.value));
      put_bytes(summary, 1, value);
    }
    put_bytes(event, 5, summary);
  }
  return event;
}

// Decodes an Event record (the fields above; others skipped).
// throws: DataError when the bytes are not a well-formed message.
inline Event decode_event(std::string_view bytes) {
  using namespace protobuf;
  Event e;
  Reader event(bytes);
  while (!event.done()) {
    const std::uint64_t k = event.varint();
    if (k == key(1, Wire::fixed64)) e.wall_time = event.fixed<double>();
    else if (k == key(2, Wire::varint)) e.step = std::int64_t(event.varint());
    else if (k == key(3, Wire::length_delimited)) e.file_version = std::string(event.take(std::size_t(event.varint())));
    else if (k == key(5, Wire::length_delimited)) {
      Reader summary(event.take(std::size_t(event.varint())));
      while (!summary.done()) {
        const std::uint64_t skey = summary.varint();
        if (skey != key(1, Wire::length_delimited)) {
          summary.skip(Wire(skey & 7u));
          continue;
        }
        Reader value(summary.take(std::size_t(summary.varint())));
        std::pair<std::string, float> scalar{};
        while (!value.done()) {
          const std::uint64_t vkey = value.varint();
          if (vkey == key(1, Wire::length_delimited)) scalar.first = std::string(value.take(std::size_t(value.varint())));
          else if (vkey == key(2, Wire::fixed32)) scalar.second = value.fixed<float>();
          else value.skip(Wire(vkey & 7u));
        }
        e.scalars.push_back(std::move(scalar));
      }
    } else {
      event.skip(Wire(k & 7u));
    }
  }
  return e;
}

// Appends Event records to a new events.out.tfevents.* file in `dir` (created if missing). Each
// record goes out in one write(2): a killed run leaves whole records behind it (TensorBoard reads
// up to a torn last one).
class EventWriter {
 public:
  explicit EventWriter(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    KILN_CHECK(!ec && std::filesystem::is_directory(dir), DataError, "log directory ", dir,
               " cannot be created: ", ec ? ec.message() : "a file of that name is in the way");
    char host[256] = "localhost";
    ::gethostname(host, sizeof host - 1);
    const auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    // TensorBoard finds the files by "tfevents" in the name; the pid keeps two runs apart, and a
    // sequence number two writers of one process within one second.
    const std::string stem = dir + "/events.out.tfevents." + std::to_string(std::int64_t(now)) + "." + host + "." +
                             std::to_string(::getpid());
    for (int n = 0; fd_ < 0 && n < 1000; ++n) {
      path_ = stem + (n == 0 ? "" : "." + std::to_string(n)) + ".kiln";
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
      if (fd_ < 0 && errno != EEXIST) break;
    }
    KILN_CHECK(fd_ >= 0, DataError, "cannot create event file ", path_, ": ", std::strerror(errno));
    append(encode_event(now, 0, {}, "brain.Event:2"));
  }
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  ~EventWriter() {
    if (fd_ >= 0) ::close(fd_);
  }

  const std::string& path() const { return path_; }

  // One Event at `step` holding every scalar (TensorBoard keys its charts by tag).
  void write_scalars(std::int64_t step, const std::vector<Scalar>& scalars) {
    const auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    append(encode_event(now, step, scalars));
  }

 private:
  void append(std::string_view event) {
    std::string record;
    append_tfrecord(record, event);
    const int e = detail::write_all(fd_, record.data(), record.size());
    KILN_CHECK(e == 0, DataError, "cannot append to event file ", path_, ": ", std::strerror(e));
  }

  std::string path_;
  int fd_ = -1;
};

}  // namespace kiln::io

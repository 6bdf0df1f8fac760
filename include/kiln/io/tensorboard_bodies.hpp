// kiln/io/tensorboard_bodies.hpp — the bodies of tensorboard.hpp's functions: included by it when
// kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/io/tensorboard.hpp"

namespace kiln::io {

namespace protobuf {

KILN_COMPILED void put_varint(std::string& out, std::uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(char((v & 0x7Fu) | 0x80u));
  out.push_back(char(v));
}

KILN_COMPILED void put_bytes(std::string& out, std::uint32_t field, std::string_view s) {
  put_key(out, field, Wire::length_delimited);
  put_varint(out, s.size());
  out.append(s);
}

KILN_COMPILED std::uint64_t Reader::varint() {
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    KILN_CHECK(at_ < msg_.size(), DataError, "protobuf: varint runs past the message end");
    const auto b = static_cast<unsigned char>(msg_[at_++]);
    v |= std::uint64_t(b & 0x7Fu) << shift;
    if (!(b & 0x80u)) return v;
  }
  throw DataError("protobuf: varint longer than 10 bytes");
}

KILN_COMPILED std::string_view Reader::take(std::size_t n) {
  KILN_CHECK(n <= msg_.size() - at_, DataError, "protobuf: field of ", n, " bytes runs past the message end");
  const auto s = msg_.substr(at_, n);
  at_ += n;
  return s;
}

KILN_COMPILED void Reader::skip(Wire wire) {
  switch (wire) {
    case Wire::varint: varint(); return;
    case Wire::fixed64: take(8); return;
    case Wire::length_delimited: take(std::size_t(varint())); return;
    case Wire::fixed32: take(4); return;
  }
  throw DataError("protobuf: unsupported wire type " + std::to_string(unsigned(wire)));
}

}  // namespace protobuf

KILN_COMPILED std::string encode_event(double wall_time, std::int64_t step, const std::vector<Scalar>& scalars,
                                       std::string_view file_version) {
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

KILN_COMPILED Event decode_event(std::string_view bytes) {
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
          if (vkey == key(1, Wire::length_delimited))
            scalar.first = std::string(value.take(std::size_t(value.varint())));
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

KILN_COMPILED EventWriter::EventWriter(const std::string& dir) {
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
    path_ = stem;  // appended piece by piece: GCC 12's -Wrestrict misreads "." + to_string(n)
    if (n > 0) (path_ += '.') += std::to_string(n);
    path_ += ".kiln";
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  KILN_CHECK(fd_ >= 0, DataError, "cannot create event file ", path_, ": ", std::strerror(errno));
  append(encode_event(now, 0, {}, "brain.Event:2"));
}

KILN_COMPILED EventWriter::~EventWriter() {
  if (fd_ >= 0) ::close(fd_);
}

KILN_COMPILED void EventWriter::write_scalars(std::int64_t step, const std::vector<Scalar>& scalars) {
  const auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  append(encode_event(now, step, scalars));
}

KILN_COMPILED void EventWriter::append(std::string_view event) {
  std::string record;
  append_tfrecord(record, event);
  const int e = detail::write_all(fd_, record.data(), record.size());
  KILN_CHECK(e == 0, DataError, "cannot append to event file ", path_, ": ", std::strerror(e));
}

}  // namespace kiln::io

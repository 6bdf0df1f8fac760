// kiln/io/scalar_csv_bodies.hpp — the bodies of scalar_csv.hpp's functions: included by it when
// kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/io/scalar_csv.hpp"

namespace kiln::io {

KILN_COMPILED ScalarCsv::ScalarCsv(std::string path) : path_(std::move(path)) {
  {
    std::ifstream in(path_);
    std::getline(in, header_);
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  KILN_CHECK(fd_ >= 0, DataError, "cannot open ", path_, " for appending: ", std::strerror(errno));
}

KILN_COMPILED ScalarCsv::~ScalarCsv() {
  if (fd_ >= 0) ::close(fd_);
}

KILN_COMPILED void ScalarCsv::write(std::int64_t step, const std::vector<Scalar>& scalars) {
  std::string header = "step,wall_time";
  for (const Scalar& s : scalars) header += "," + s.tag;
  std::string text;
  if (header_.empty()) {
    header_ = header;
    text = header + "\n";
  }
  KILN_CHECK(header == header_, ValueError, path_, " has the columns \"", header_, "\"; this row has \"", header,
             "\"");
  const auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char number[64];
  std::snprintf(number, sizeof number, "%lld,%.3f", (long long)step, now);
  text += number;
  for (const Scalar& s : scalars) {
    std::snprintf(number, sizeof number, ",%.9g", s.value);
    text += number;
  }
  text += "\n";
  // One write(2) per row: a killed run leaves whole rows.
  const int e = detail::write_all(fd_, text.data(), text.size());
  KILN_CHECK(e == 0, DataError, "cannot append to ", path_, ": ", std::strerror(e));
}

}  // namespace kiln::io

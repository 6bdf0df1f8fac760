// kiln/io/scalar_csv.hpp — the training log as CSV, for people without TensorBoard: one row per
// logged step, `step,wall_time,<tag>,<tag>,…`, appended to a file a resumed run continues.
//
//   kiln::io::ScalarCsv csv("runs/mlp/scalars.csv");
//   csv.write(step, {{"train/loss", 0.31}, {"train/lr", 1e-3}});
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "kiln/core/error.hpp"
#include "kiln/io/tensorboard.hpp"

namespace kiln::io {

class ScalarCsv {
 public:
  // Opens `path` for appending; an existing file's header fixes the columns.
  explicit ScalarCsv(std::string path) : path_(std::move(path)) {
    {
      std::ifstream in(path_);
      std::getline(in, header_);
    }
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    KILN_CHECK(fd_ >= 0, DataError, "cannot open ", path_, " for appending: ", std::strerror(errno));
  }
  ScalarCsv(const ScalarCsv&) = delete;
  ScalarCsv& operator=(const ScalarCsv&) = delete;
  ~ScalarCsv() {
    if (fd_ >= 0) ::close(fd_);
  }

  const std::string& path() const { return path_; }

  // Appends one row. The first row of a new file writes the header from these tags.
  // throws: ValueError when the tags are not the file's columns (both named).
  void write(std::int64_t step, const std::vector<Scalar>& scalars) {
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

 private:
  std::string path_, header_;
  int fd_ = -1;
};

}  // namespace kiln::io

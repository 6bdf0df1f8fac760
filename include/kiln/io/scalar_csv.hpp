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

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/io/tensorboard.hpp"

namespace kiln::io {

class ScalarCsv {
 public:
  // Opens `path` for appending; an existing file's header fixes the columns.
  explicit ScalarCsv(std::string path);
  ScalarCsv(const ScalarCsv&) = delete;
  ScalarCsv& operator=(const ScalarCsv&) = delete;
  ~ScalarCsv();

  const std::string& path() const { return path_; }

  // Appends one row. The first row of a new file writes the header from these tags.
  // throws: ValueError when the tags are not the file's columns (both named).
  void write(std::int64_t step, const std::vector<Scalar>& scalars);

 private:
  std::string path_, header_;
  int fd_ = -1;
};

}  // namespace kiln::io

#if KILN_HEADER_BODIES
#include "kiln/io/scalar_csv_bodies.hpp"
#endif

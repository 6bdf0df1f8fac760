// kiln/io/training_log.hpp — a training run's scalars in both forms at once: TensorBoard event
// files (io/tensorboard.hpp) and scalars.csv (io/scalar_csv.hpp) in one directory.
//
//   kiln::io::TrainingLog log("runs/mlp");   // tensorboard --logdir runs
//   log.write(step, {{"train/loss", loss}, {"perf/steps_per_s", rate}});
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/io/scalar_csv.hpp"
#include "kiln/io/tensorboard.hpp"

namespace kiln::io {

class TrainingLog {
 public:
  explicit TrainingLog(const std::string& dir) : events_(dir), csv_(dir + "/scalars.csv") {}

  void write(std::int64_t step, const std::vector<Scalar>& scalars) {
    events_.write_scalars(step, scalars);
    csv_.write(step, scalars);
  }
  const std::string& event_file() const { return events_.path(); }
  const std::string& csv_file() const { return csv_.path(); }

 private:
  EventWriter events_;  // first: it creates the directory the CSV goes in
  ScalarCsv csv_;
};

}  // namespace kiln::io

// kiln/train/checkpoint_dir.hpp — a directory of checkpoints: save every N steps keeping the last
// K, and resume from the newest one that loads and verifies.
//
//   kiln::train::CheckpointDir dir("runs/digits", {.keep = 2});
//   if (auto info = dir.resume(step)) loader.start_epoch(info->position.epoch, info->position.batch);
//   ...
//   dir.save(step, {.epoch = e, .batch = b});   // runs/digits/step-000000120.safetensors
//
// Files are written atomically (kiln/io/atomic_file.hpp), so a run killed at any moment leaves
// the previous checkpoints whole; a temporary file a killed save left behind is removed by the
// next CheckpointDir on that directory. resume() tries the checkpoints newest first and skips one
// that does not load (with a warning naming it and why), so a damaged newest file costs the steps
// since the one before, not the run.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/warning.hpp"
#include "kiln/train/checkpoint.hpp"

namespace kiln::train {

struct CheckpointDirOptions {
  index_t keep = 2;              // checkpoints kept; older ones are deleted after each save
  std::string prefix = "step-";  // file names: <prefix><optimizer step, 9 digits>.safetensors
};

class CheckpointDir {
 public:
  // Creates the directory (and its parents) when missing; removes temporary files of saves that a
  // killed run left behind.
  // throws: ValueError for keep < 1; DataError naming the directory when it cannot be created.
  KILN_COMPILED explicit CheckpointDir(std::string dir, CheckpointDirOptions options = {});

  const std::string& path() const { return dir_; }
  KILN_COMPILED std::string file_for(index_t optimizer_step) const;

  // The checkpoints in the directory, newest (highest step) first.
  KILN_COMPILED std::vector<std::string> list() const;

  // Saves a checkpoint named by the step's optimizer-step count, then deletes all but the newest
  // `keep`. Returns the file written.
  // throws: as save_checkpoint; on failure the existing checkpoints are untouched.
  template <class StepT>
  std::string save(StepT& step, TrainPosition position, const std::map<std::string, std::string>& extra = {}) {
    const std::string file = file_for(step.optimizer_steps());
    save_checkpoint(file, step, position, extra);
    const auto all = list();
    std::error_code ec;
    for (std::size_t i = std::size_t(opt_.keep); i < all.size(); ++i) std::filesystem::remove(all[i], ec);
    return file;
  }

  // Loads the newest checkpoint that loads and verifies into the step; std::nullopt when the
  // directory holds none. Each one skipped is a kiln::warn naming the file and its error.
  // throws: DataError when checkpoints exist but none of them loads (naming each one's error).
  template <class StepT>
  std::optional<CheckpointInfo> resume(StepT& step) {
    std::string errors;
    for (const std::string& file : list()) {
      try {
        return load_checkpoint(file, step);
      } catch (const DataError& e) {
        warn(std::string("skipping checkpoint that does not load: ") + e.what());
        errors += std::string("\n  ") + e.what();
      }
    }
    KILN_CHECK(errors.empty(), DataError, "checkpoint directory ", dir_, ": no checkpoint loads:", errors);
    return std::nullopt;
  }

 private:
  std::string dir_;
  CheckpointDirOptions opt_;
};

}  // namespace kiln::train

#if KILN_HEADER_BODIES
#include "kiln/train/checkpoint_dir_bodies.hpp"
#endif

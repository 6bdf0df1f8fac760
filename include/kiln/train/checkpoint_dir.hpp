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
  explicit CheckpointDir(std::string dir, CheckpointDirOptions options = {})
      : dir_(std::move(dir)), opt_(std::move(options)) {
    KILN_CHECK(opt_.keep >= 1, ValueError, "CheckpointDir: keep must be >= 1, got ", opt_.keep);
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    KILN_CHECK(!ec && std::filesystem::is_directory(dir_), DataError, "checkpoint directory ", dir_,
               ": cannot be created: ", ec ? ec.message() : std::string("a file of that name exists"));
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("." + opt_.prefix, 0) == 0 && name.find(".safetensors.tmp.") != std::string::npos)
        std::filesystem::remove(e.path(), ec);
    }
  }

  const std::string& path() const { return dir_; }
  std::string file_for(index_t optimizer_step) const {
    char digits[32];
    std::snprintf(digits, sizeof digits, "%09lld", static_cast<long long>(optimizer_step));
    return dir_ + "/" + opt_.prefix + digits + ".safetensors";
  }

  // The checkpoints in the directory, newest (highest step) first.
  std::vector<std::string> list() const {
    std::vector<std::pair<long long, std::string>> found;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      const std::string ext = ".safetensors";
      if (name.rfind(opt_.prefix, 0) != 0 || name.size() <= opt_.prefix.size() + ext.size() ||
          name.compare(name.size() - ext.size(), ext.size(), ext) != 0)
        continue;
      const std::string digits = name.substr(opt_.prefix.size(), name.size() - opt_.prefix.size() - ext.size());
      if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 18) continue;
      found.emplace_back(std::stoll(digits), e.path().string());
    }
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<std::string> out;
    for (auto& f : found) out.push_back(std::move(f.second));
    return out;
  }

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

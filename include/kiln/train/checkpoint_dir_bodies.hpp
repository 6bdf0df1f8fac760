// kiln/train/checkpoint_dir_bodies.hpp — the bodies of checkpoint_dir.hpp's functions: included by
// it when kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED,
// kiln/config.hpp).
#pragma once

#include "kiln/train/checkpoint_dir.hpp"

namespace kiln::train {

KILN_COMPILED CheckpointDir::CheckpointDir(std::string dir, CheckpointDirOptions options)
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

KILN_COMPILED std::string CheckpointDir::file_for(index_t optimizer_step) const {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%09lld", static_cast<long long>(optimizer_step));
  return dir_ + "/" + opt_.prefix + digits + ".safetensors";
}

KILN_COMPILED std::vector<std::string> CheckpointDir::list() const {
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

}  // namespace kiln::train

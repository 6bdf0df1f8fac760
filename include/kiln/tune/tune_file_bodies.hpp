// kiln/tune/tune_file_bodies.hpp — the bodies of tune_file.hpp's functions: included by it when kiln
// is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/tune/tune_file.hpp"

namespace kiln::tune {

KILN_COMPILED std::string default_cache_dir() {
  if (const char* d = std::getenv("KILN_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/kiln";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kiln";
  return {};
}

KILN_COMPILED std::vector<std::string> TuneFile::open(const std::string& dir, const std::string& kind,
                                                      const std::string& fingerprint) {
  fingerprint_ = fingerprint;
  if (dir.empty()) {
    warn("autotune: no cache directory (KILN_CACHE_DIR, XDG_CACHE_HOME and HOME are unset); tuning without a cache");
    return {};
  }
  dir_ = dir;
  char name[64];
  std::snprintf(name, sizeof name, "%s-%08x.kiln-tune", kind.c_str(),
                unsigned(io::crc32c(fingerprint.data(), fingerprint.size())));
  path_ = dir + "/" + name;
  std::ifstream in(path_, std::ios::binary);
  if (!in) return {};  // nothing cached yet
  std::ostringstream text;
  text << in.rdbuf();
  std::string why;
  std::vector<std::string> lines;
  if (!parse(text.str(), lines, why)) {
    reject(why);
    return {};
  }
  return lines;
}

KILN_COMPILED void TuneFile::reject(const std::string& why) {
  warn("autotune: ignoring the cache file " + path_ + ": " + why + "; it will be rewritten");
  dirty_ = true;
}

KILN_COMPILED void TuneFile::save(const std::vector<std::string>& lines) {
  if (!dirty_ || path_.empty() || failed_) return;
  dirty_ = false;
  try {
    make_directories(dir_);
    std::string text = "kiln-autotune 1\nfingerprint " + fingerprint_ + "\n";
    for (const std::string& line : lines) text += line + "\n";
    char tail[32];
    std::snprintf(tail, sizeof tail, "crc32c %08x\n", unsigned(io::crc32c(text.data(), text.size())));
    text += tail;
    io::write_file_atomically(path_, {reinterpret_cast<const unsigned char*>(text.data()), text.size()});
  } catch (const std::exception& e) {
    failed_ = true;
    warn(std::string("autotune: cannot write the cache (") + e.what() + "); going on without one");
  }
}

KILN_COMPILED bool TuneFile::parse(const std::string& text, std::vector<std::string>& out, std::string& why) const {
  const std::size_t crc_at = text.rfind("crc32c ");
  if (crc_at == std::string::npos || (crc_at > 0 && text[crc_at - 1] != '\n')) {
    why = "it has no checksum line (truncated?)";
    return false;
  }
  unsigned stored = 0;
  char end = 0;
  if (std::sscanf(text.c_str() + crc_at, "crc32c %8x%c", &stored, &end) != 2 || end != '\n' ||
      crc_at + 16 != text.size()) {
    why = "its checksum line does not parse";
    return false;
  }
  if (unsigned(io::crc32c(text.data(), crc_at)) != stored) {
    why = "its checksum does not match its contents (corrupt)";
    return false;
  }
  std::istringstream lines(text.substr(0, crc_at));
  std::string line;
  if (!std::getline(lines, line) || line != "kiln-autotune 1") {
    why = "it is not a kiln autotune file of version 1";
    return false;
  }
  if (!std::getline(lines, line) || line != "fingerprint " + fingerprint_) {
    why = "it was written for another machine or build (" + line + ")";
    return false;
  }
  while (std::getline(lines, line)) out.push_back(line);
  return true;
}

KILN_COMPILED void TuneFile::make_directories(const std::string& dir) {
  for (std::size_t at = 1; at <= dir.size(); ++at) {
    if (at != dir.size() && dir[at] != '/') continue;
    const std::string part = dir.substr(0, at);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
      throw DataError(kiln::detail::concat("cannot create the directory ", part, ": ", std::strerror(errno)));
  }
}

}  // namespace kiln::tune

// kiln/io/atomic_file_bodies.hpp — the bodies of atomic_file.hpp's functions: included by it when
// kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/io/atomic_file.hpp"

namespace kiln::io {

namespace detail {

KILN_COMPILED std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

KILN_COMPILED std::string base_name_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

KILN_COMPILED int write_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t done = 0; done < n;) {
    const ::ssize_t w = ::write(fd, p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : ENOSPC;
    done += std::size_t(w);
  }
  return 0;
}

}  // namespace detail

KILN_COMPILED std::string temporary_name_for(const std::string& path) {
  return detail::directory_of(path) + "/." + detail::base_name_of(path) + ".tmp." + std::to_string(::getpid());
}

KILN_COMPILED void write_file_atomically(const std::string& path, std::span<const unsigned char> bytes) {
  const std::string tmp = temporary_name_for(path);
  auto fail = [&](const char* step, int e) {
    ::unlink(tmp.c_str());
    throw DataError(::kiln::detail::concat("cannot write ", path, ": ", step, " failed: ", detail::errno_text(e),
                                           " (the previous file, if any, is unchanged)"));
  };
  {
    detail::Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    if (f.fd < 0) {
      const int e = errno;  // nothing was created: do not unlink another process's file
      throw DataError(::kiln::detail::concat("cannot write ", path, ": creating ", tmp, " failed: ",
                                             detail::errno_text(e)));
    }
    if (const int e = detail::write_all(f.fd, bytes.data(), bytes.size()); e != 0) fail("writing", e);
    if (::fsync(f.fd) != 0) fail("fsync", errno);
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) fail("close", errno);  // NFS reports write errors here
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename", errno);
  // The rename is in the directory's data: sync it, or a power cut may forget the new name.
  detail::Fd dir{::open(detail::directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd >= 0) ::fsync(dir.fd);  // best effort: some file systems refuse fsync on directories
}

}  // namespace kiln::io

// kiln/io/atomic_file.hpp — replacing a file so that a crash, a kill or a full disk at any moment
// leaves either the old file or the new one, never a mix: write a temporary file in the same
// directory, fsync it, rename it over the target, fsync the directory (POSIX rename is atomic
// within a file system; the directory fsync makes the rename itself durable).
//
//   kiln::io::write_file_atomically("ckpt/step-100.safetensors", {bytes.data(), bytes.size()});
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::io {

namespace detail {
inline std::string errno_text(int e) { return std::strerror(e); }

// The directory part of a path ("." for a bare name).
KILN_COMPILED std::string directory_of(const std::string& path);
KILN_COMPILED std::string base_name_of(const std::string& path);

// Writes all n bytes to fd, resuming after signals and short writes.
// returns: 0, or the errno of the failure (ENOSPC for a write that made no progress).
KILN_COMPILED int write_all(int fd, const void* data, std::size_t n);

// Closes a descriptor on every way out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace detail

// The temporary name write_file_atomically uses for `path`: hidden, in the same directory, unique
// per process, and recognisable (a directory scan can remove ones a killed run left behind).
KILN_COMPILED std::string temporary_name_for(const std::string& path);

// Replaces `path` with `bytes` atomically and durably (see the header comment).
// throws: DataError naming the file and the step that failed (create, write, fsync, rename) with
//   the system's reason; the temporary file is removed and an existing `path` is untouched.
KILN_COMPILED void write_file_atomically(const std::string& path, std::span<const unsigned char> bytes);

}  // namespace kiln::io

#if KILN_HEADER_BODIES
#include "kiln/io/atomic_file_bodies.hpp"
#endif

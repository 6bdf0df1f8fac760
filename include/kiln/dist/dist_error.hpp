// kiln/dist/dist_error.hpp — the error of a multi-process job, and the one timeout its waits share.
#pragma once

#include <cstdlib>

#include "kiln/core/error.hpp"

namespace kiln::dist {

// A collective or the group's set-up failed (another rank died, a library refused, ranks disagree).
class DistError : public Error {
 public:
  using Error::Error;
};

// How long a rank waits for the others (a rendezvous, a device collective) before it gives up
// with a DistError: KILN_DIST_TIMEOUT seconds, 300 by default (PyTorch's NCCL default is 600;
// a dead rank is found sooner here).
inline double timeout_seconds() {
  const char* v = std::getenv("KILN_DIST_TIMEOUT");
  if (v == nullptr || *v == '\0') return 300;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  KILN_CHECK(end != v && *end == '\0' && s > 0, DistError, "KILN_DIST_TIMEOUT=", v,
             " must be a positive number of seconds");
  return s;
}

}  // namespace kiln::dist

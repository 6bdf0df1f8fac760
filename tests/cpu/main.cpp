// The doctest runner for every CPU suite in this folder.
//
// Without OpenMP every "same result at any thread count" test would compare a one-thread run
// with itself and pass, proving nothing: such a build fails here, saying so, unless
// KILN_TESTS_WITHOUT_OPENMP=1 accepts it (then a warning heads the output).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
#if !defined(_OPENMP)
  const char* accept = std::getenv("KILN_TESTS_WITHOUT_OPENMP");
  if (accept == nullptr || std::strcmp(accept, "1") != 0) {
    std::fprintf(stderr,
                 "kiln CPU tests: FAILED — built without OpenMP, so the thread-count tests would compare a run "
                 "with itself; build with OpenMP, or set KILN_TESTS_WITHOUT_OPENMP=1 to run them anyway\n");
    return 3;
  }
  std::fprintf(stderr, "kiln CPU tests: WARNING — no OpenMP: every run is single-threaded, and the tests of "
                       "results at several thread counts prove nothing here\n");
#endif
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  return context.run();
}

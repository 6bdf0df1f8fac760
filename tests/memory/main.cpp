// The doctest main of kiln_tests_memory (its allocator is counting_new.cpp). The heap's peak is
// measured as the memory planner models it — live blocks only — so kiln keeps no freed host
// blocks for reuse here (kiln/core/host_block_cache.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "kiln/core/host_block_cache.hpp"

int main(int argc, char** argv) {
  kiln::set_host_cache_limit(0);
  return doctest::Context(argc, argv).run();
}

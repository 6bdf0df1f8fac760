// The doctest main of kiln_tests_memory (its allocator is counting_new.cpp).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

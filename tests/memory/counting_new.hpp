// The counting allocator of the kiln_tests_memory binary (counting_new.cpp replaces the global
// operator new and delete): bytes on the heap now, the peak since the last reset, and how many
// allocations were made — every heap byte a training step takes, whoever asked for it.
#pragma once

#include <cstddef>

namespace kiln_memory_test {

std::size_t heap_in_use();
std::size_t heap_peak();
void reset_heap_peak();  // the peak becomes what is in use now
std::size_t heap_allocations();

}  // namespace kiln_memory_test

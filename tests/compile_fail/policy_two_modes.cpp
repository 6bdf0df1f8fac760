// expect: kiln::policy: two mode tags
#include <kiln/policy/policy.hpp>

int main() {
  kiln::policy<kiln::mode::reduce_overhead, kiln::mode::max_autotune> p;
  (void)p;
}

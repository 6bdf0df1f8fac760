// expect: kiln::policy: two mode tags
// Control: one mode tag.
#include <kiln/policy/policy.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::policy<kiln::mode::reduce_overhead> p;
#else
  kiln::policy<kiln::mode::reduce_overhead, kiln::mode::max_autotune> p;
#endif
  (void)p;
}

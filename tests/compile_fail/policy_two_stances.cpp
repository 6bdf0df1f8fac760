// expect: kiln::policy: two stance tags
// Control: one stance tag.
#include <kiln/policy/policy.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::policy<kiln::stance::fused> p;
#else
  kiln::policy<kiln::stance::fused, kiln::stance::force_eager> p;
#endif
  (void)p;
}

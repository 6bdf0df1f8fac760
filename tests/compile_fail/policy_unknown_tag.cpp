// expect: kiln::policy: a tag is not a policy tag
// A type that belongs to no policy category.
// Control: the policy tag alone, without float.
#include <kiln/policy/policy.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::policy<kiln::stance::force_eager> p;
#else
  kiln::policy<kiln::stance::force_eager, float> p;
#endif
  (void)p;
}

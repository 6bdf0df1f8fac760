// expect: kiln::policy: two loss_scaling tags
// Control: one loss_scaling tag (the precision tag kept).
#include <kiln/policy/policy.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::policy<kiln::loss_scaling::dynamic, kiln::precision::fp16_mixed> p;
#else
  kiln::policy<kiln::loss_scaling::dynamic, kiln::precision::fp16_mixed, kiln::loss_scaling::none> p;
#endif
  (void)p;
}

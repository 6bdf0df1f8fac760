// expect: kiln::policy: two loss_scaling tags
#include <kiln/policy/policy.hpp>

int main() {
  kiln::policy<kiln::loss_scaling::dynamic, kiln::precision::fp16_mixed, kiln::loss_scaling::none> p;
  (void)p;
}

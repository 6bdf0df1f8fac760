// expect: kiln::policy: two stance tags
#include <kiln/policy/policy.hpp>

int main() {
  kiln::policy<kiln::stance::fused, kiln::stance::force_eager> p;
  (void)p;
}

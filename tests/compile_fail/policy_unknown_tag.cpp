// expect: kiln::policy: a tag is not a policy tag
// A type that belongs to no policy category.
#include <kiln/policy/policy.hpp>

int main() {
  kiln::policy<kiln::stance::force_eager, float> p;
  (void)p;
}

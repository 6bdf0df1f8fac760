// expect: kiln::policy: two accumulate<N> tags
// Control: one accumulate<N> tag.
#include <kiln/policy/policy.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::policy<kiln::accumulate<2>> p;
#else
  kiln::policy<kiln::accumulate<2>, kiln::accumulate<4>> p;
#endif
  (void)p;
}

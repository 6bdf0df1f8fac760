// expect: kiln::policy: two precision tags
// Two precision tags in one bag: which one was meant?
// Control: one precision tag (the other tag kept).
#include <kiln/policy/policy.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::policy<kiln::precision::fp16_mixed, kiln::accumulate<2>> p;
#else
  kiln::policy<kiln::precision::fp16_mixed, kiln::accumulate<2>, kiln::precision::bf16_mixed> p;
#endif
  (void)p;
}

// expect: kiln::policy: two precision tags
// Two precision tags in one bag: which one was meant?
#include <kiln/policy/policy.hpp>

int main() {
  kiln::policy<kiln::precision::fp16_mixed, kiln::accumulate<2>, kiln::precision::bf16_mixed> p;
  (void)p;
}

// expect: kiln::policy: two accumulate<N> tags
#include <kiln/policy/policy.hpp>

int main() {
  kiln::policy<kiln::accumulate<2>, kiln::accumulate<4>> p;
  (void)p;
}

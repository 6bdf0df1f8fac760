// expect: accumulate<N>: N micro-batches per optimizer step must be at least 1
// Zero micro-batches per optimizer step would never step.
#include <kiln/policy/policy.hpp>

int main() {
  kiln::policy<kiln::accumulate<0>> p;
  (void)p;
}

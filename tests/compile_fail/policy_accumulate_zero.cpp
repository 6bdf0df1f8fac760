// expect: accumulate<N>: N micro-batches per optimizer step must be at least 1
// Zero micro-batches per optimizer step would never step.
// Control: accumulate<1>.
#include <kiln/policy/policy.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::policy<kiln::accumulate<1>> p;
#else
  kiln::policy<kiln::accumulate<0>> p;
#endif
  (void)p;
}

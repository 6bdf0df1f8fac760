// expect: kiln::dtype_of<T>: T is not a kiln element type
// dtype_of on a type kiln cannot store must fail with a sentence that lists the ones it can.
// Control: double, a kiln element type.
#include <kiln/core/dtype.hpp>

#ifdef KILN_COMPILE_FAIL_CONTROL
int main() { return static_cast<int>(kiln::dtype_of<double>); }
#else
int main() { return static_cast<int>(kiln::dtype_of<long double>); }
#endif

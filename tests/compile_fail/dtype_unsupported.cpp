// expect: kiln::dtype_of<T>: T is not a kiln element type
// dtype_of on a type kiln cannot store must fail with a sentence that lists the ones it can.
#include <kiln/core/dtype.hpp>

int main() { return static_cast<int>(kiln::dtype_of<long double>); }

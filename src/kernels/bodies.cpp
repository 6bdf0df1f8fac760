// kiln::kernels: the bodies of kiln's non-template functions that are worth compiling once — the
// data readers, the loader and the data-parallel bucket plan (KILN_COMPILED, kiln/config.hpp). A
// program linking the library sees their declarations only. Nothing here may depend on a
// program's configuration (MPI, CUDA): the library is built once for all of them.
#define KILN_COMPILE_BODIES 1
#include "kiln/data/cifar.hpp"
#include "kiln/data/csv.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/data/file.hpp"
#include "kiln/data/idx.hpp"
#include "kiln/data/loader.hpp"
#include "kiln/data/normalize.hpp"
#include "kiln/dist/buckets.hpp"

// kiln::kernels: the bodies of kiln/io's non-template functions that are worth compiling once — the
// JSON and safetensors readers and writers, TFRecord framing, the TensorBoard and CSV logs, CRC-32C
// and atomic file replacement (KILN_COMPILED, kiln/config.hpp). A program linking the library sees
// their declarations only. Nothing here may depend on a program's configuration (MPI, CUDA): the
// library is built once for all of them.
//
// KILN_COMPILE_BODIES is not defined here: it would compile every body the headers include, and
// safetensors.hpp includes kiln/data/file.hpp, whose bodies bodies.cpp compiles (a second
// definition of data::read_file and the others, a multiple-definition error at link time). The
// headers come in as declarations (KILN_HEADER_BODIES 0), then io's own bodies files, whose
// KILN_COMPILED definitions are then ordinary, non-inline ones.
#include "kiln/io/atomic_file_bodies.hpp"
#include "kiln/io/crc32c_bodies.hpp"
#include "kiln/io/json_bodies.hpp"
#include "kiln/io/safetensors_bodies.hpp"
#include "kiln/io/scalar_csv_bodies.hpp"
#include "kiln/io/tensorboard_bodies.hpp"
#include "kiln/io/tfrecord_bodies.hpp"

// kiln::kernels: the bodies of the training helpers' non-template functions that are worth
// compiling once — mode::max_autotune's CPU GEMM tuner with its cache and tune file (the timing
// code for every element type among them), the checkpoint directory and a checkpoint's metadata
// reader, the memory plan and the step report (KILN_COMPILED, kiln/config.hpp). A program linking
// the library sees their declarations only. Nothing here may depend on a program's configuration
// (MPI, CUDA): the library is built once for all of them.
//
// KILN_COMPILE_BODIES is not defined here: it would compile every body the headers include —
// data::read_file and the others through kiln/io/safetensors.hpp (bodies.cpp compiles them), the
// safetensors and JSON readers, CRC-32C and atomic files (bodies_io.cpp) — a second definition of
// each, a multiple-definition error at link time. The headers come in as declarations
// (KILN_HEADER_BODIES 0), then these bodies files, whose KILN_COMPILED definitions are then
// ordinary, non-inline ones.
#include "kiln/train/checkpoint_bodies.hpp"
#include "kiln/train/checkpoint_dir_bodies.hpp"
#include "kiln/train/memory_plan_bodies.hpp"
#include "kiln/train/report_bodies.hpp"
#include "kiln/tune/gemm_tuner_bodies.hpp"
#include "kiln/tune/tune_cache_bodies.hpp"
#include "kiln/tune/tune_file_bodies.hpp"

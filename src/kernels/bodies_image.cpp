// kiln::kernels: the bodies of the image reader (JPEG / PNG decoding), the image transforms and
// ImageFolder (KILN_COMPILED, kiln/config.hpp), in a file of their own: libjpeg's and libpng's
// headers and the resampling code stay out of bodies.cpp, and the two compile in parallel. A
// program linking the library sees the declarations only; whether JPEG and PNG decode is decided
// here, by the KILN_HAVE_JPEG / KILN_HAVE_PNG that the kiln target gives this file.
//
// KILN_COMPILE_BODIES is not defined here: it would compile every body the headers include —
// data::read_raw_file (file.hpp) and subset / split (dataset.hpp), which bodies.cpp compiles — a
// second definition of each, a multiple-definition error at link time. The headers come in as
// declarations (KILN_HEADER_BODIES 0), then these bodies files, whose KILN_COMPILED definitions
// are then ordinary, non-inline ones.
#include "kiln/data/image_bodies.hpp"
#include "kiln/data/image_folder_bodies.hpp"
#include "kiln/data/image_transforms_bodies.hpp"
#include "kiln/data/image_write_bodies.hpp"

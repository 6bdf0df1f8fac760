// kiln/config.hpp — the one place that spells CUDA's execution-space keywords.
//
// Every other header writes KILN_HOST_DEVICE; under nvcc it becomes __host__ __device__ so the
// same functor code runs in CPU tests and in CUDA kernels, under a host compiler it is plain
// inline code.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__ __forceinline__
#define KILN_DEVICE __device__ __forceinline__
#define KILN_GLOBAL __global__
#define KILN_CUDA_COMPILER 1
#elif defined(__GNUC__) || defined(__clang__)
// Forced inline on the host too, as __forceinline__ on the device: a fused loop calls a chain of
// functors and evaluators, and GCC's inlining budget for a large function (an executor's
// elementwise holds several loops) otherwise leaves calls in the loop, which then stays scalar.
#define KILN_HOST_DEVICE inline __attribute__((always_inline))
#define KILN_DEVICE inline
#define KILN_CUDA_COMPILER 0
#else
#define KILN_HOST_DEVICE inline
#define KILN_DEVICE inline
#define KILN_CUDA_COMPILER 0
#endif

// True while nvcc compiles the device side of a translation unit.
#if defined(__CUDA_ARCH__)
#define KILN_DEVICE_PASS 1
#else
#define KILN_DEVICE_PASS 0
#endif

// A function declared weak: a reference to it that no file of the program defines links to null
// instead of failing (ELF, GCC and Clang). kiln declares stance::force_eager's form of each op so.
#define KILN_WEAK __attribute__((weak))

// Whether the ops' headers bring their stance::force_eager forms (kiln/force_eager.hpp): on by
// default. A file that defines KILN_FORCE_EAGER_FORMS 0 before including kiln compiles the fused
// forms alone — a fifth of a small training program's compile time — and its ops reach the
// unfused forms through weak references: to the ones another file of the program compiled, or
// to none (a force_eager tape then throws ValueError naming kiln/force_eager.hpp). ODR-safe: the
// setting changes which form definitions a file holds, never an op's code. A file with it off
// whose model uses types with internal linkage (an anonymous namespace's functor) must include
// kiln/force_eager.hpp, as no other file can define their forms.
#ifndef KILN_FORCE_EAGER_FORMS
#define KILN_FORCE_EAGER_FORMS 1
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KILN_RESTRICT __restrict__
#else
#define KILN_RESTRICT
#endif

// kiln::kernels, the optional compiled part (CMake target kiln::kernels, src/kernels/): code that
// does not depend on a model's types — the CPU GEMM for each element type, ... — compiled once in
// the library instead of in every translation unit. A program that links it is built with
// KILN_KERNELS_LIBRARY, and the headers then declare those instantiations `extern template`
// (KILN_EXTERN_KERNELS); the library's own files define KILN_KERNELS_BUILD and instantiate them.
// Without it kiln is header-only, and every definition is compiled where it is used.
#if defined(KILN_KERNELS_LIBRARY) && !defined(KILN_KERNELS_BUILD)
#define KILN_EXTERN_KERNELS 1
#else
#define KILN_EXTERN_KERNELS 0
#endif

// The same for non-template functions whose bodies are worth compiling once (the data readers,
// the loader): declared with KILN_COMPILED; their bodies sit in `#if KILN_HEADER_BODIES` blocks.
// Header-only, they are inline and their bodies always there. A program linking kiln::kernels sees
// the declarations only; the library compiles the bodies once, in src/kernels/bodies*.cpp:
// bodies.cpp defines KILN_COMPILE_BODIES (every body its headers bring), bodies_io.cpp and
// bodies_train.cpp include their *_bodies.hpp files directly (their headers include data/ ones,
// whose bodies bodies.cpp already compiles: a second copy would be a multiple definition).
#if !defined(KILN_KERNELS_LIBRARY)
#define KILN_HEADER_BODIES 1
#define KILN_COMPILED inline
#elif defined(KILN_COMPILE_BODIES)
#define KILN_HEADER_BODIES 1
#define KILN_COMPILED
#else
#define KILN_HEADER_BODIES 0
#define KILN_COMPILED
#endif

namespace kiln {

// Sizes and indices are signed 64-bit: no unsigned wrap-around in shape arithmetic, and large
// enough for any tensor one device holds.
using index_t = std::int64_t;

// A dependent false for static_asserts in templates that must not be instantiated.
template <class...>
inline constexpr bool dependent_false = false;

inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;

}  // namespace kiln

// kiln/cuda.cuh — the CUDA backend; include from files compiled by nvcc, after or instead of
// <kiln.hpp>.
#pragma once

#include "kiln.hpp"
#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/cublaslt.cuh"
#include "kiln/backend/cuda/device.cuh"
#include "kiln/backend/cuda/executor.cuh"
#include "kiln/backend/cuda/memory.cuh"
#include "kiln/backend/cuda/pinned.cuh"
#include "kiln/dist/device_reducer.cuh"

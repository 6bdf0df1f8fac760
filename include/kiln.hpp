// kiln.hpp — the umbrella header for host code (CPU backend, expressions, training).
// CUDA users include <kiln/cuda.cuh> from files compiled by nvcc as well.
#pragma once

#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/extents.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/core/view.hpp"
#include "kiln/expr/assign.hpp"
#include "kiln/expr/elementwise.hpp"
#include "kiln/ops/reduce.hpp"
#include "kiln/backend/cpu/executor.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/autograd/var.hpp"
#include "kiln/autograd/tape.hpp"
#include "kiln/autograd/map.hpp"
#include "kiln/autograd/matmul.hpp"
#include "kiln/autograd/reduce.hpp"

// kiln/force_eager.hpp — stance::force_eager's form of every op: every expression node its own
// kernel forward and backward, a Linear's, a convolution's and a batch norm's bias and activation
// out of the epilogue, cross_entropy as log_softmax then nll_loss — the unfused baseline fusion is
// measured against, and a way to debug a fused result.
//
// The ops' headers include their forms by default. A file that turns them off
// (KILN_FORCE_EAGER_FORMS 0, kiln/config.hpp) and still runs a force_eager tape, or whose model
// has types with internal linkage, includes this header. How it works: each op declares its
// eager form as a weak function template (KILN_WEAK) and calls it only on a force_eager tape;
// a file that sees the forms' definitions instantiates the ones its ops use, and every op of the
// program links to them; where no file compiled one, the op throws ValueError naming this header.
#pragma once

#include "kiln/autograd/linear_eager.hpp"
#include "kiln/autograd/map_eager.hpp"
#include "kiln/nn/fused_eager.hpp"
#include "kiln/nn/loss_eager.hpp"

// kiln/autograd/fold.hpp — folding the first step of a producer's backward into the GEMM of the
// op that consumes its output.
//
// Backward runs consumers before producers. When a consumer computes its input's gradient with a
// GEMM (the next Linear's dX = dZ·W), the producer (a Linear with a ReLU) would next run
// dZ' = dX * relu'(z) and db = column sums of dZ': exactly what cuBLASLt's DRELU_BGRAD epilogue
// does on the GEMM that made dX. So a producer that can do this leaves an offer on its output
// variable (VarNode::fold), and a GEMM-backed consumer hands its gradient GEMM to the offer
// instead of writing the gradient itself.
//
// The offer writes into the producer's own buffer, never into the variable's gradient, so other
// consumers (an elementwise op, a second layer reading the same activations) still add their
// contributions to the gradient as usual, and the producer combines both. At most one consumer
// takes the offer per backward.
#pragma once

#include <memory>

#include "kiln/autograd/var.hpp"
#include "kiln/config.hpp"

namespace kiln::ag {

// A producer's offer, stored on its output variable.
template <class Exec, class T>
struct GemmGradFold {
  virtual ~GemmGradFold() = default;
  // Computes the variable's gradient contribution op(A)·op(B) (an [m, n] row-major matrix of the
  // variable's shape) with the producer's first backward step in the GEMM's epilogue, into the
  // producer's buffers. false when it cannot (already taken in this backward, another shape, an
  // inner size the executor's epilogue refuses): the caller then writes the gradient itself.
  virtual bool gemm(Exec& exec, bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, index_t lda,
                    const T* b, index_t ldb) = 0;
};

namespace detail {
// One address per (executor, value type): what VarNode::fold_key holds for a GemmGradFold.
template <class Exec, class T>
inline constexpr char gemm_grad_fold_key = 0;
}  // namespace detail

template <class Exec, class T>
void offer_fold(VarNode& node, std::shared_ptr<GemmGradFold<Exec, T>> fold) {
  node.fold = std::move(fold);
  node.fold_key = &detail::gemm_grad_fold_key<Exec, T>;
}

// The gradient of `node` gets op(A)·op(B) ([m, n], row stride n): through the producer's offer
// when there is one that takes it, else written (first contribution) or added to the gradient.
// requires: node's elements are T.
template <class Exec, class T>
void gemm_into_grad(Exec& exec, VarNode& node, bool ta, bool tb, index_t m, index_t n, index_t k, const T* a,
                    index_t lda, const T* b, index_t ldb) {
  if (node.fold_key == &detail::gemm_grad_fold_key<Exec, T>) {
    auto* fold = static_cast<GemmGradFold<Exec, T>*>(node.fold.get());
    if (fold->gemm(exec, ta, tb, m, n, k, a, lda, b, ldb)) return;
  }
  const float beta = node.grad_valid ? 1.f : 0.f;
  T* g = static_cast<T*>(node.ensure_grad_data());
  exec.gemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, g, n);
  node.grad_valid = true;
}

}  // namespace kiln::ag

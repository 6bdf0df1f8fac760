// kiln/autograd/matmul.hpp — C = op(A)·op(B) on variables; backward is two GEMMs that add
// into the inputs' gradients (beta = 1) or write them (beta = 0, first contribution), or hand
// the GEMM to the input's producer when it offers to fold its backward in (autograd/fold.hpp).
#pragma once

#include "kiln/autograd/fold.hpp"
#include "kiln/autograd/tape.hpp"
#include "kiln/ops/matmul.hpp"

namespace kiln::ag {

// op(X) = X, or Xᵀ when the flag is set. Linear layers use matmul(x, W, false, true): x·Wᵀ.
template <class Exec, class T, class S, index_t A0, index_t A1, index_t B0, index_t B1>
auto matmul(Tape<Exec>& tape, const Var<T, S, A0, A1>& a, const Var<T, S, B0, B1>& b, bool ta = false,
            bool tb = false) {
  const index_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const index_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  KILN_CHECK(k == kb, ShapeError, "matmul: inner sizes differ: op(a) is [", m, ", ", k, "] (a ", a.shape().str(),
             ta ? " transposed" : "", "), op(b) is [", kb, ", ", n, "] (b ", b.shape().str(), tb ? " transposed" : "",
             ")");
  Var<T, S, dyn, dyn> out(Tensor<T, S, dyn, dyn>(m, n));
  const index_t lda = ta ? m : k, ldb = tb ? k : n;
  tape.exec().gemm(ta, tb, m, n, k, 1.f, a.value().data(), lda, b.value().data(), ldb, 0.f, out.value().data(), n);
  if (!(a.requires_grad() || b.requires_grad()) || !tape.recording()) return out;
  out.set_requires_grad(true);
  tape.record(out, {a.data(), b.data()}, [ad = a.data(), bd = b.data(), ta, tb, m, n, k, lda, ldb](Exec& exec, auto& od) {
    if (!od.grad_valid) return;
    const T* dc = od.grad.data();
    const T* A = ad->value.data();
    const T* B = bd->value.data();
    if (ad->requires_grad) {
      if (!ta) gemm_into_grad(exec, *ad, false, !tb, m, k, n, dc, n, B, ldb);  // dC·op(B)ᵀ
      else gemm_into_grad(exec, *ad, tb, true, k, m, n, B, ldb, dc, n);        // op(B)·dCᵀ
    }
    if (bd->requires_grad) {
      if (!tb) gemm_into_grad(exec, *bd, !ta, false, k, n, m, A, lda, dc, n);  // op(A)ᵀ·dC
      else gemm_into_grad(exec, *bd, true, ta, n, k, m, dc, n, A, lda);        // dCᵀ·op(A)
    }
  });
  return out;
}

}  // namespace kiln::ag

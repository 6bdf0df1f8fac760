// kiln/autograd/diff.hpp — the backward of a fused elementwise expression, derived at compile
// time from the forward expression's type.
//
// Diff<E> mirrors Evaluator<E>: fwd(r, c) computes the element's forward values bottom-up into
// a record (a struct shaped like the expression), and bwd(record, adjoint, r, c) walks it
// top-down applying each functor's partial derivatives (the chain rule). One kernel over the
// output therefore writes the gradients of ALL inputs in one pass.
//
// fwd_flat(i) / bwd_flat(record, adjoint, i) are the same walk by flat index, valid when
// flat_ok() (every leaf reads its memory in the output's element order; a broadcast input's
// adjoints go to a dense scratch of the output's shape, so they index flat too): the kernel then
// runs as one loop over the elements instead of rows x columns, which for NCHW activations means
// a loop of N*C*H*W rather than W-long rows (7 columns at ResNet's last stage).
#pragma once

#include <functional>
#include <vector>

#include "kiln/autograd/var.hpp"
#include "kiln/expr/evaluator.hpp"
#include "kiln/expr/lower.hpp"
#include "kiln/expr/reduce_ops.hpp"

namespace kiln::ag {

// Host-side bookkeeping for one backward kernel: which variables it writes, which broadcast
// inputs need their adjoints reduced afterwards.
template <class Exec>
struct BackwardPlan {
  Exec& exec;
  std::vector<VarNode*> seen;
  std::vector<VarNode*> written;
  TempList<typename Exec::space> temps;
  std::vector<std::function<void()>> after;  // reductions of broadcast inputs' adjoints

  // Whether this occurrence adds to the gradient (true) or writes it (first contribution).
  bool claim(VarNode* n) {
    for (VarNode* s : seen)
      if (s == n) return true;
    seen.push_back(n);
    written.push_back(n);
    return n->grad_valid;
  }
  void finish() {
    for (auto& f : after) f();
    for (VarNode* n : written) n->grad_valid = true;
  }
};

template <class E>
class Diff;

// Leaves that are not variables: values only.
template <class L>
class LeafDiff {
 public:
  using value_type = typename Evaluator<L>::value_type;
  struct Rec {
    value_type v;
  };
  template <class Plan>
  LeafDiff(const L& l, const Shape& dst, Plan&) : ev_(l, dst) {}
  KILN_HOST_DEVICE Rec fwd(index_t r, index_t c) const { return {ev_.at(r, c)}; }
  KILN_HOST_DEVICE void bwd(const Rec&, value_type, index_t, index_t) const {}
  KILN_HOST_DEVICE Rec fwd_flat(index_t i) const { return {ev_.flat(i)}; }
  KILN_HOST_DEVICE void bwd_flat(const Rec&, value_type, index_t) const {}
  bool flat_ok() const { return ev_.flat_ok(); }

 private:
  Evaluator<L> ev_;
};
template <class T, class S, class Ext>
class Diff<View<T, S, Ext>> : public LeafDiff<View<T, S, Ext>> {
  using LeafDiff<View<T, S, Ext>>::LeafDiff;
};
template <class T>
class Diff<Scalar<T>> : public LeafDiff<Scalar<T>> {
  using LeafDiff<Scalar<T>>::LeafDiff;
};

// A variable: its adjoint goes to its gradient, or — when it is broadcast in the expression —
// to a full-size scratch buffer that is summed down to its shape after the kernel.
template <class T, class S, class Ext>
class Diff<VarLeaf<T, S, Ext>> {
 public:
  using value_type = compute_t<T>;
  struct Rec {
    value_type v;
  };
  template <class Plan>
  Diff(const VarLeaf<T, S, Ext>& l, const Shape& dst, Plan& plan) : ev_(l, dst) {
    VarNode& d = *l.owner;  // a VarData<T, S, Ext'> whose Ext' may name the sizes Ext erased
    if (!d.requires_grad) return;
    const index_t rows = dst.rows(), cols = dst.cols();
    rs_ = cols;
    if (l.shape().size() == dst.size()) {
      add_ = plan.claim(&d);
      g_ = static_cast<T*>(d.ensure_grad_data());
      return;
    }
    // Broadcast input: write adjoints densely, then reduce them to the input's shape.
    auto buf = plan.exec.temps().take(std::size_t(dst.size()) * sizeof(T));
    g_ = static_cast<T*>(buf.get());
    plan.temps.push_back(std::move(buf));
    const bool add = plan.claim(&d);
    const LeafStrides ls = fold_strides(l.shape(), l.view.strides(), true, dst);
    T* scratch = g_;
    auto* exec = &plan.exec;
    plan.after.push_back([=, &d] {
      T* out = static_cast<T*>(d.ensure_grad_data());
      // ONE reduction, which adds to the gradient when it already holds a contribution.
      auto sum_into = [&](auto&&... reduce_args) { exec->template reduce<red::Sum>(out, reduce_args..., add); };
      if (ls.rs == 0 && ls.cs == 0) {  // a scalar: sum everything
        View<const T, S, extents<dyn>> all(scratch, Shape{rows * cols});
        sum_into(Evaluator<decltype(all)>(all, all.shape()), index_t(1), rows * cols, false);
      } else if (ls.rs == 0) {  // a row broadcast over rows: sum each column
        View<const T, S, extents<dyn, dyn>> t(scratch, Shape{cols, rows}, {1, cols});
        sum_into(Evaluator<decltype(t)>(t, t.shape()), cols, rows, true);
      } else {  // a column broadcast over columns: sum each row
        View<const T, S, extents<dyn, dyn>> m(scratch, Shape{rows, cols});
        sum_into(Evaluator<decltype(m)>(m, m.shape()), rows, cols, true);
      }
    });
  }
  KILN_HOST_DEVICE Rec fwd(index_t r, index_t c) const { return {ev_.at(r, c)}; }
  KILN_HOST_DEVICE void bwd(const Rec&, value_type adj, index_t r, index_t c) const { bwd_flat({}, adj, r * rs_ + c); }
  KILN_HOST_DEVICE Rec fwd_flat(index_t i) const { return {ev_.flat(i)}; }
  // g_ is the gradient or the broadcast scratch, both dense in the output's shape.
  KILN_HOST_DEVICE void bwd_flat(const Rec&, value_type adj, index_t i) const {
    if (!g_) return;
    T& g = g_[i];
    g = add_ ? T(compute_t<T>(g) + adj) : T(adj);
  }
  bool flat_ok() const { return ev_.flat_ok(); }

 private:
  Evaluator<VarLeaf<T, S, Ext>> ev_;
  T* g_ = nullptr;
  index_t rs_ = 0;
  bool add_ = false;
};

template <class F, class A>
class Diff<Unary<F, A>> {
 public:
  using value_type = typename Unary<F, A>::value_type;
  struct Rec {
    value_type v;
    typename Diff<A>::Rec a;
  };
  template <class Plan>
  Diff(const Unary<F, A>& n, const Shape& dst, Plan& plan) : f_(n.f), a_(n.a, dst, plan) {}
  KILN_HOST_DEVICE Rec fwd(index_t r, index_t c) const {
    const auto ra = a_.fwd(r, c);
    return {f_(value_type(ra.v)), ra};
  }
  KILN_HOST_DEVICE void bwd(const Rec& rec, value_type adj, index_t r, index_t c) const {
    a_.bwd(rec.a, adj * f_.d(value_type(rec.a.v)), r, c);
  }
  KILN_HOST_DEVICE Rec fwd_flat(index_t i) const {
    const auto ra = a_.fwd_flat(i);
    return {f_(value_type(ra.v)), ra};
  }
  KILN_HOST_DEVICE void bwd_flat(const Rec& rec, value_type adj, index_t i) const {
    a_.bwd_flat(rec.a, adj * f_.d(value_type(rec.a.v)), i);
  }
  bool flat_ok() const { return a_.flat_ok(); }

 private:
  F f_;
  Diff<A> a_;
};

template <class F, class A, class B>
class Diff<Binary<F, A, B>> {
 public:
  using value_type = typename Binary<F, A, B>::value_type;
  struct Rec {
    value_type v;
    typename Diff<A>::Rec a;
    typename Diff<B>::Rec b;
  };
  template <class Plan>
  Diff(const Binary<F, A, B>& n, const Shape& dst, Plan& plan) : f_(n.f), a_(n.a, dst, plan), b_(n.b, dst, plan) {}
  KILN_HOST_DEVICE Rec fwd(index_t r, index_t c) const {
    const auto ra = a_.fwd(r, c);
    const auto rb = b_.fwd(r, c);
    return {f_(value_type(ra.v), value_type(rb.v)), ra, rb};
  }
  KILN_HOST_DEVICE void bwd(const Rec& rec, value_type adj, index_t r, index_t c) const {
    const value_type va = value_type(rec.a.v), vb = value_type(rec.b.v);
    a_.bwd(rec.a, adj * f_.d0(va, vb), r, c);
    b_.bwd(rec.b, adj * f_.d1(va, vb), r, c);
  }
  KILN_HOST_DEVICE Rec fwd_flat(index_t i) const {
    const auto ra = a_.fwd_flat(i);
    const auto rb = b_.fwd_flat(i);
    return {f_(value_type(ra.v), value_type(rb.v)), ra, rb};
  }
  KILN_HOST_DEVICE void bwd_flat(const Rec& rec, value_type adj, index_t i) const {
    const value_type va = value_type(rec.a.v), vb = value_type(rec.b.v);
    a_.bwd_flat(rec.a, adj * f_.d0(va, vb), i);
    b_.bwd_flat(rec.b, adj * f_.d1(va, vb), i);
  }
  bool flat_ok() const { return a_.flat_ok() && b_.flat_ok(); }

 private:
  F f_;
  Diff<A> a_;
  Diff<B> b_;
};

template <class F, class A, class B, class C>
class Diff<Ternary<F, A, B, C>> {
 public:
  using value_type = typename Ternary<F, A, B, C>::value_type;
  struct Rec {
    value_type v;
    typename Diff<A>::Rec a;
    typename Diff<B>::Rec b;
    typename Diff<C>::Rec c;
  };
  template <class Plan>
  Diff(const Ternary<F, A, B, C>& n, const Shape& dst, Plan& plan)
      : f_(n.f), a_(n.a, dst, plan), b_(n.b, dst, plan), c_(n.c, dst, plan) {}
  KILN_HOST_DEVICE Rec fwd(index_t r, index_t c) const {
    const auto ra = a_.fwd(r, c);
    const auto rb = b_.fwd(r, c);
    const auto rc = c_.fwd(r, c);
    return {f_(value_type(ra.v), value_type(rb.v), value_type(rc.v)), ra, rb, rc};
  }
  KILN_HOST_DEVICE void bwd(const Rec& rec, value_type adj, index_t r, index_t c) const {
    const value_type va = value_type(rec.a.v), vb = value_type(rec.b.v), vc = value_type(rec.c.v);
    a_.bwd(rec.a, adj * f_.d0(va, vb, vc), r, c);
    b_.bwd(rec.b, adj * f_.d1(va, vb, vc), r, c);
    c_.bwd(rec.c, adj * f_.d2(va, vb, vc), r, c);
  }
  KILN_HOST_DEVICE Rec fwd_flat(index_t i) const {
    const auto ra = a_.fwd_flat(i);
    const auto rb = b_.fwd_flat(i);
    const auto rc = c_.fwd_flat(i);
    return {f_(value_type(ra.v), value_type(rb.v), value_type(rc.v)), ra, rb, rc};
  }
  KILN_HOST_DEVICE void bwd_flat(const Rec& rec, value_type adj, index_t i) const {
    const value_type va = value_type(rec.a.v), vb = value_type(rec.b.v), vc = value_type(rec.c.v);
    a_.bwd_flat(rec.a, adj * f_.d0(va, vb, vc), i);
    b_.bwd_flat(rec.b, adj * f_.d1(va, vb, vc), i);
    c_.bwd_flat(rec.c, adj * f_.d2(va, vb, vc), i);
  }
  bool flat_ok() const { return a_.flat_ok() && b_.flat_ok() && c_.flat_ok(); }

 private:
  F f_;
  Diff<A> a_;
  Diff<B> b_;
  Diff<C> c_;
};

// A cast passes the gradient straight through (in the destination's compute type).
template <class To, class A>
class Diff<Cast<To, A>> {
 public:
  using value_type = compute_t<To>;
  struct Rec {
    value_type v;
    typename Diff<A>::Rec a;
  };
  template <class Plan>
  Diff(const Cast<To, A>& n, const Shape& dst, Plan& plan) : a_(n.a, dst, plan) {}
  KILN_HOST_DEVICE Rec fwd(index_t r, index_t c) const {
    const auto ra = a_.fwd(r, c);
    return {convert<value_type>(convert<To>(ra.v)), ra};
  }
  KILN_HOST_DEVICE void bwd(const Rec& rec, value_type adj, index_t r, index_t c) const {
    a_.bwd(rec.a, typename Diff<A>::value_type(adj), r, c);
  }
  KILN_HOST_DEVICE Rec fwd_flat(index_t i) const {
    const auto ra = a_.fwd_flat(i);
    return {convert<value_type>(convert<To>(ra.v)), ra};
  }
  KILN_HOST_DEVICE void bwd_flat(const Rec& rec, value_type adj, index_t i) const {
    a_.bwd_flat(rec.a, typename Diff<A>::value_type(adj), i);
  }
  bool flat_ok() const { return a_.flat_ok(); }

 private:
  Diff<A> a_;
};

// The fused backward kernel: for each element, forward record then chain rule. flat: launched
// as one row of every element (diff.flat_ok(); see the top of this file), c the flat index.
template <class E, class G>
struct MapBackwardKernel {
  Diff<E> diff;
  const G* grad_out;
  index_t cols;
  bool flat = false;
  KILN_HOST_DEVICE void operator()(index_t r, index_t c) const {
    using V = typename Diff<E>::value_type;
    if (flat) {
      const auto rec = diff.fwd_flat(c);
      diff.bwd_flat(rec, V(grad_out[c]), c);
      return;
    }
    const auto rec = diff.fwd(r, c);
    diff.bwd(rec, V(grad_out[r * cols + c]), r, c);
  }
  // Elements [b, e) of a flat launch, for a backend that runs a range at once (the CPU). On a
  // private copy of the kernel the compiler keeps its pointers and flags in registers and
  // vectorises the loop (checking at run time that the gradients it writes do not overlap what it
  // reads), so ReLU's x > 0 becomes a blend, not a branch per element the predictor cannot learn.
  void run_flat(index_t b, index_t e) const {
    using V = typename Diff<E>::value_type;
    const Diff<E> d = diff;
    const G* go = grad_out;
    for (index_t i = b; i < e; ++i) d.bwd_flat(d.fwd_flat(i), V(go[i]), i);
  }
};

}  // namespace kiln::ag

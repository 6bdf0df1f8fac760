// kiln/autograd/reduce.hpp — sum and mean of variables (all elements or the last axis), with
// their backward: the output gradient broadcast back over the reduced elements.
#pragma once

#include "kiln/autograd/tape.hpp"
#include "kiln/ops/reduce.hpp"

namespace kiln::ag {

namespace detail {
template <class Op, reduce_over Over, class Exec, class T, class S, index_t... D>
auto reduce_var(Tape<Exec>& tape, const Var<T, S, D...>& x) {
  static_assert(Over != reduce_over::last_axis_keepdim, "kiln: ag reductions drop the reduced axis");
  using R = Reduce<Op, VarLeaf<T, S, extents<D...>>, Over>;
  R node(to_leaf(x));
  using Out = var_t<T, S, typename R::extents_type>;
  Out out(typename Out::tensor_type(node.shape()));
  assign(out.value(), node, tape.exec());
  if (!x.requires_grad() || !tape.recording()) return out;
  out.set_requires_grad(true);
  tape.record(out, {x.data()}, [xd = x.data()](Exec& exec, auto& od) {
    if (!od.grad_valid || !xd->requires_grad) return;
    const Shape s = xd->value.shape();
    const index_t n = Over == reduce_over::all ? s.size() : s.cols();
    const T scale = std::is_same_v<Op, red::Mean> ? T(1) / T(n > 0 ? n : 1) : T(1);
    // The output gradient as a scalar or a column [rows, 1] broadcast over the input.
    const Shape gs = Over == reduce_over::all ? Shape{} : Shape{s.rows(), 1};
    View<const T, S, extents<dyn, dyn>> g2(od.grad.data(), Shape{s.rows(), 1});
    View<const T, S, extents<>> g0(od.grad.data(), Shape{});
    View<T, S, extents<dyn, dyn>> dx(xd->ensure_grad(), Shape{s.rows(), s.cols()});
    const bool add = xd->grad_valid;
    auto run = [&](const auto& g) {
      if (add) assign(dx, dx + g * scale, exec);
      else assign(dx, g * scale, exec);
    };
    if (gs.rank == 0) run(g0);
    else run(g2);
    xd->grad_valid = true;
  });
  return out;
}
}  // namespace detail

template <reduce_over Over = reduce_over::all, class Exec, class T, class S, index_t... D>
auto sum(Tape<Exec>& tape, const Var<T, S, D...>& x) {
  return detail::reduce_var<red::Sum, Over>(tape, x);
}
template <reduce_over Over = reduce_over::all, class Exec, class T, class S, index_t... D>
auto mean(Tape<Exec>& tape, const Var<T, S, D...>& x) {
  return detail::reduce_var<red::Mean, Over>(tape, x);
}

}  // namespace kiln::ag

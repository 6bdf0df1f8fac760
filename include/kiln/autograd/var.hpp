// kiln/autograd/var.hpp — variables: a value tensor, its gradient, and whether it needs one.
//
// A Var is a shared handle (copies refer to the same node), as in PyTorch. Gradients follow
// set-to-none semantics: after zero_grad() the next contribution writes the gradient instead of
// adding to it (no fill kernel), later ones add.
//
// Ownership of the graph, as in PyTorch: a variable made by a recorded op owns that op's backward
// step (VarNode::grad_fn), and the step owns the variables it sends gradients to (its inputs).
// So a result keeps exactly the graph it depends on alive, and a result that is dropped frees its
// graph and the activations it saved — evaluating without NoGrad costs work, not memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/finite.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/expr/evaluator.hpp"
#include "kiln/expr/node.hpp"

namespace kiln::ag {

struct VarNode;

// One recorded op's backward step, type-erased (the tape that recorded it knows how to run it).
// Owned by the variable the op produced; owns the variables whose gradients it writes.
struct GradFn {
  std::vector<std::shared_ptr<VarNode>> inputs;
  std::uint64_t seq = 0;             // recording order: backward() runs steps in decreasing seq
  const void* exec_key = nullptr;    // the executor type of the tape that recorded it
  std::uint64_t visited = 0;         // the last backward() traversal that reached it
  std::shared_ptr<std::size_t> live;  // the recording tape's count of steps alive
  GradFn() = default;
  GradFn(const GradFn&) = delete;
  GradFn& operator=(const GradFn&) = delete;
  virtual ~GradFn();
};

// The type-erased part of a variable the tape and backward kernels need.
struct VarNode {
  bool requires_grad = false;
  bool grad_valid = false;  // false: the gradient buffer holds no contribution yet
  // Set when a backward() ran and released grad_fn: a later backward() through this variable
  // would miss the gradients of everything before it, so it throws instead.
  bool graph_freed = false;
  // Set once parameter_of handed the gradient buffer's address to an optimizer table: freezing
  // then keeps the buffer (nn/freeze.hpp), which that table may still touch.
  bool grad_shared = false;
  std::shared_ptr<GradFn> grad_fn;  // null for leaves (parameters, inputs) and freed results
  std::size_t consumers = 0;        // live backward steps that list this variable as an input
  // Set by the op that produced this variable when it can run the first step of its own backward
  // inside the GEMM that computes this variable's gradient (ag::linear's act' and bias gradient
  // in a DRELU_BGRAD-style epilogue). Keyed by executor and value type; see autograd/fold.hpp.
  std::shared_ptr<void> fold;
  const void* fold_key = nullptr;
  // Set by the op that produced this variable when its value is cheap to make again from what
  // that op's backward keeps anyway (batch norm + activation: from its input and statistics):
  // writes the value, bit for bit, into the buffer given (the value's type and shape), with the
  // given thread count. A consumer that reads the value again only in its backward may then free
  // it after forward (autograd/remake.hpp). Host results only.
  std::function<void(void*, int)> remake;
  // Anomaly mode (autograd/anomaly.hpp): the index of the first NaN / infinity in the gradient
  // (-1: none, or no valid gradient), and the variable's shape, for the report.
  virtual index_t first_nonfinite_grad() const { return -1; }
  virtual std::string shape_text() const { return "?"; }
  // The value's elements and the gradient buffer (given the value's shape) of the variable, whose
  // element type the caller knows: for backward code compiled once for every shape (ag::linear's).
  virtual const void* value_data() const { return nullptr; }
  virtual void* ensure_grad_data() { return nullptr; }
  virtual const void* grad_data() const { return nullptr; }  // the gradient buffer as it is
  virtual ~VarNode() = default;
};

inline GradFn::~GradFn() {
  if (live) --*live;
  for (const auto& in : inputs) --in->consumers;
}

template <class T, class S, class Ext>
struct tensor_of;
template <class T, class S, index_t... D>
struct tensor_of<T, S, extents<D...>> {
  using type = Tensor<T, S, D...>;
};

template <class T, class S, class Ext>
struct VarData : VarNode {
  using tensor_type = typename tensor_of<T, S, Ext>::type;
  tensor_type value;
  tensor_type grad;
  // Gives the gradient buffer the value's shape (contents unspecified until grad_valid).
  T* ensure_grad() {
    if (!(grad.shape() == value.shape())) grad.resize(value.shape());
    return grad.data();
  }
  index_t first_nonfinite_grad() const override {
    if (!grad_valid || !(grad.shape() == value.shape())) return -1;
    return first_nonfinite<T, S>(grad.data(), grad.size());
  }
  std::string shape_text() const override { return value.shape().str(); }
  const void* value_data() const override { return value.data(); }
  void* ensure_grad_data() override { return ensure_grad(); }
  const void* grad_data() const override { return grad.data(); }
};

template <class T, class S, index_t... Dims>
class Var {
 public:
  using value_type = T;
  using space = S;
  using extents_type = extents<Dims...>;
  using data_type = VarData<T, S, extents_type>;
  using tensor_type = typename data_type::tensor_type;

  Var() : d_(std::make_shared<data_type>()) {}
  explicit Var(tensor_type&& value, bool requires_grad = false) : d_(std::make_shared<data_type>()) {
    d_->value = std::move(value);
    d_->requires_grad = requires_grad;
  }

  tensor_type& value() const { return d_->value; }
  // The gradient; meaningful once has_grad() (after a backward pass reached this variable).
  tensor_type& grad() const { return d_->grad; }
  bool has_grad() const { return d_->grad_valid; }
  bool requires_grad() const { return d_->requires_grad; }
  void set_requires_grad(bool on) { d_->requires_grad = on; }
  void zero_grad() { d_->grad_valid = false; }
  const Shape& shape() const { return d_->value.shape(); }
  // The value of a one-element variable (a loss) on the host. On a device this waits for all
  // work the device has queued: read it every few steps, not every step, in a fast loop.
  // throws: ShapeError when the variable holds more or fewer than one element.
  T item() const {
    KILN_CHECK(d_->value.size() == 1, ShapeError, "item() needs a one-element variable, got shape ",
               d_->value.shape().str());
    T out{};
    memory_traits<S>::copy_to_host(&out, d_->value.data(), sizeof(T));
    return out;
  }
  index_t dim(int i) const { return d_->value.dim(i); }
  const std::shared_ptr<data_type>& data() const { return d_; }

 private:
  std::shared_ptr<data_type> d_;
};

template <class X>
inline constexpr bool is_var_v = false;
template <class T, class S, index_t... D>
inline constexpr bool is_var_v<Var<T, S, D...>> = true;

template <class T, class S, class Ext>
struct var_of;
template <class T, class S, index_t... D>
struct var_of<T, S, extents<D...>> {
  using type = Var<T, S, D...>;
};
template <class T, class S, class Ext>
using var_t = typename var_of<T, S, Ext>::type;

// A variable inside an expression: read like a view; backward writes its gradient.
template <class T, class S, class Ext>
struct VarLeaf {
  static constexpr bool is_leaf_node = true;
  using value_type = T;
  using space = S;
  using extents_type = Ext;
  View<const T, S, Ext> view;
  // Host side only; keeps the variable alive. Untyped: the erased form of an expression
  // (autograd/erased_expr.hpp) refers to the same variable with its sizes dropped.
  std::shared_ptr<VarNode> owner;
  Shape shape() const { return view.shape(); }
};

template <class T, class S, index_t... D>
VarLeaf<T, S, extents<D...>> to_leaf(const Var<T, S, D...>& v) {
  return {std::as_const(v.value()).view(), v.data()};
}

}  // namespace kiln::ag

namespace kiln {

template <class T, class S, class Ext>
class Evaluator<ag::VarLeaf<T, S, Ext>> : public Evaluator<View<const T, S, Ext>> {
 public:
  Evaluator(const ag::VarLeaf<T, S, Ext>& l, const Shape& dst) : Evaluator<View<const T, S, Ext>>(l.view, dst) {}
};

// A variable reads like a view (expr/evaluator.hpp: the erased form of an expression).
template <class T, class S, class Ext>
struct detail::erased_leaf<ag::VarLeaf<T, S, Ext>> {
  using type = View<const T, S, dyn_extents_t<Ext>>;
};

}  // namespace kiln

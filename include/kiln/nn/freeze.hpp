// kiln/nn/freeze.hpp — fine-tuning: parameters that do not train (PyTorch's requires_grad_(False)).
//
//   kiln::nn::freeze(model.layer<0>());             // a whole layer (or a nested model)
//   kiln::nn::set_requires_grad(model.layer<2>().bias(), false);   // one parameter
//   kiln::optim::AdamW opt(model, {.lr = 1e-3});     // built after: only the trainable parameters
//
// A frozen parameter gets no gradient buffer and no optimizer state (Sequential::parameters()
// and param_table() leave it out), its layer skips its weight-gradient GEMM, and nothing runs
// backward below the lowest trainable layer: the autograd records only what needs a gradient.
// Sequential::launches_now and train::Step::predicted_launches count what that saves.
// Freeze before building the optimizer: one built earlier keeps the parameter in its table (its
// gradient is then never valid again, so it is skipped, but its state stays allocated).
#pragma once

#include "kiln/autograd/var.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::nn {

// One parameter trainable (on) or frozen. Freezing drops any gradient it holds (set to none), so
// an optimizer that still lists it skips it, and frees the gradient buffer unless such an
// optimizer has its address (unfreezing makes a new one when a backward or an optimizer needs it).
template <class T, class S, index_t... D>
void set_requires_grad(const ag::Var<T, S, D...>& parameter, bool on) {
  auto& node = *parameter.data();
  node.requires_grad = on;
  if (on) return;
  node.grad_valid = false;
  if (!node.grad_shared) [[maybe_unused]] auto released = std::move(node.grad);
}

// Every parameter of a layer or a model (nested ones included) trainable or frozen.
template <has_parameters Layer>
void set_requires_grad(const Layer& layer, bool on) {
  layer.for_each_parameter([on](const auto& v) { set_requires_grad(v, on); });
}
template <class Layer>
void freeze(const Layer& layer) {
  set_requires_grad(layer, false);
}
template <class Layer>
void unfreeze(const Layer& layer) {
  set_requires_grad(layer, true);
}

// Whether any / every parameter of a layer trains.
template <class Layer>
bool any_trainable(const Layer& layer) {
  return param_grads_of(layer).any;
}
template <class Layer>
bool all_trainable(const Layer& layer) {
  bool all = true;
  layer.for_each_parameter([&](const auto& v) { all = all && v.requires_grad(); });
  return all;
}

}  // namespace kiln::nn

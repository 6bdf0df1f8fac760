// kiln/autograd/remake.hpp — activations freed after forward and made again in backward.
//
// A convolution's weight gradient needs its input; when that input is a batch norm + ReLU's
// output, keeping it doubles what the pair saves (the batch norm keeps its own input for its
// backward). nn::BatchNorm2d marks such an output remakeable (VarNode::remake: the same
// elements, bit for bit, from its input and the constants its forward used), nn::Sequential
// frees it once the next layer — one that says it can take it back (`remakes_input`) — has run
// forward, and that layer's backward reads it through value_or_remade: the value itself, or the
// value made again into scratch that lives for the call. ResNet-50's training peak drops by
// 15.8 MiB per image that way (its bottlenecks' two inner activations, and the stem's pool input).
#pragma once

#include "kiln/autograd/var.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::ag {

// Frees v's elements (its shape stays, for its gradient) when they can be made again.
template <class T, class S, index_t... D>
void free_remakeable(const Var<T, S, D...>& v) {
  auto& node = *v.data();
  if (node.remake && node.value.data() != nullptr) node.value.free_elements();
}
template <class X>
void free_remakeable(const X&) {}  // not a variable: nothing to free

// The node's value: its elements, or — freed by free_remakeable — made again into scratch.
template <class Node, class T>
const T* value_or_remade(Node& node, Tensor<T, host, dyn>& scratch, int threads) {
  if (node.value.data() != nullptr) return node.value.data();
  KILN_CHECK(bool(node.remake), ValueError, "kiln: a value of shape ", node.value.shape().str(),
             " was freed after forward and cannot be made again for backward");
  scratch.resize(Shape{node.value.size()});
  node.remake(scratch.data(), threads);
  return scratch.data();
}

}  // namespace kiln::ag

// kiln/nn/empty_batch.hpp — a batch of 0 samples through the layers whose kernels need at least
// one (convolution, pooling, batch norm), as PyTorch runs it.
//
// PyTorch returns an empty output from each of these layers (batch norm leaves its running
// statistics as they are), and backward gives their parameters gradients of zero: the parameters
// took part in the step, so an optimizer still steps them (weight decay, momentum) and a
// data-parallel all-reduce still finds a gradient on a rank whose share of the batch was empty.
// Linear, the activations and the losses need nothing here: their kernels run over 0 rows.
#pragma once

#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kiln/autograd/tape.hpp"
#include "kiln/autograd/var.hpp"
#include "kiln/config.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::nn::detail {

template <class T>
struct FillZero {
  T* p;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const { p[i] = T(0); }
};

// A gradient of zero for `node` when it wants one and holds none yet (one holding a contribution
// keeps it: adding zero changes nothing). Runs on the executor's stream, so it is ordered with the
// rest of backward and can be captured into a CUDA graph.
template <class Exec, class Node>
void contribute_zero_grad(Exec& exec, Node* node) {
  if (node == nullptr || !node->requires_grad || node->grad_valid) return;
  using T = std::remove_pointer_t<decltype(node->ensure_grad())>;
  T* g = node->ensure_grad();
  if (const index_t n = node->value.size(); n > 0)
    exec.for_each_element(1, n, FillZero<T>{g}, kind::elementwise, std::string("zero_grad(empty batch)"),
                          std::size_t(n) * sizeof(T));
  node->grad_valid = true;
}

// The output of a layer given 0 samples: an empty `Out` of shape `out_shape` whose backward gives
// x and each parameter (null ones are skipped) a zero gradient.
template <class Out, class Exec, class XVar, class... Nodes>
Out empty_batch_output(ag::Tape<Exec>& tape, const Shape& out_shape, const XVar& x,
                       const std::shared_ptr<Nodes>&... params) {
  Out out{typename Out::tensor_type(out_shape)};
  const bool any = x.requires_grad() || ((params && params->requires_grad) || ...);
  if (!any || !tape.recording()) return out;
  out.set_requires_grad(true);
  std::vector<std::shared_ptr<ag::VarNode>> inputs{x.data()};
  (..., (params ? inputs.push_back(params) : void()));
  // A tuple, not a captured pack: nvcc's front end rejects a fold over a pack captured by a lambda.
  tape.record(out, std::move(inputs), [xd = x.data(), ps = std::tuple(params...)](Exec& exec, auto& od) {
    if (!od.grad_valid) return;
    contribute_zero_grad(exec, xd.get());
    std::apply([&](const auto&... p) { (..., contribute_zero_grad(exec, p.get())); }, ps);
  });
  return out;
}

}  // namespace kiln::nn::detail

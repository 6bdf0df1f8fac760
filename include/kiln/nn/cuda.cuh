// kiln/nn/cuda.cuh — the nn layers on kiln::cuda: include from an nvcc translation unit to use
// Linear<..., kiln::cuda>, LayerNorm<..., kiln::cuda>, the convnet layers and
// Sequential<...>::on<kiln::cuda> (it includes every nn header whose ops run on the CUDA executor:
// activation, attention (kiln's fp32 / fp64 kernels), batchnorm, conv (cuDNN, when the build has
// it), dropout, embedding, layernorm, linear, loss, pool, reshape, residual, sequential, softmax,
// transformer).
//
// It defines nn::space_ops<cuda> (declared in kiln/nn/module.hpp): parameters are initialised on
// the host, as for the host layers, and copied to the device with kiln::to_device; gradient
// buffers are zero-filled with cudaMemset (on the legacy default stream, so ordered with a
// CudaExecutor on the default stream or on any blocking stream).
//
//   using Mlp = nn::Sequential<nn::Linear<400, 256>, nn::ReLU, nn::Linear<256, 10>>;
//   Mlp::on<kiln::cuda> model(seed);            // the numbers Mlp(seed) has, on the device
//   kiln::CudaExecutor exec;
//   ag::Tape<kiln::CudaExecutor> tape(exec);
//   auto loss = nn::cross_entropy(tape, model.forward(tape, x), device_labels);
//   tape.backward(loss);
//   optim::ParamTable table = model.param_table();   // device pointers
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kiln/backend/cuda/attention.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/cudnn_conv.cuh"
#include "kiln/backend/cuda/executor.cuh"
#include "kiln/backend/cuda/memory.cuh"
#include "kiln/nn/activation.hpp"
#include "kiln/nn/attention.hpp"
#include "kiln/nn/batchnorm.hpp"
#include "kiln/nn/conv.hpp"
#include "kiln/nn/dropout.hpp"
#include "kiln/nn/embedding.hpp"
#include "kiln/nn/layernorm.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/pool.hpp"
#include "kiln/nn/reshape.hpp"
#include "kiln/nn/residual.hpp"
#include "kiln/nn/sequential.hpp"
#include "kiln/nn/softmax.hpp"
#include "kiln/nn/transformer.hpp"

namespace kiln::nn {

template <>
struct space_ops<cuda> {
  template <class T, index_t... D>
  static Tensor<T, cuda, D...> from_host(Tensor<T, host, D...>&& t) {
    return to_device(t);
  }
  template <class T>
  static void zero(T* p, index_t n) {
    // Once per parameter when a table is built (not per step): a device-wide wait makes the
    // zeros visible to an executor on any stream, non-blocking ones included.
    if (n > 0) {
      KILN_CUDA_CHECK(cudaMemsetAsync(p, 0, std::size_t(n) * sizeof(T), cudaStream_t{}));
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
  template <class T>
  static void copy_from_host(T* dst, const T* src, index_t n) {
    if (n > 0) KILN_CUDA_CHECK(cudaMemcpy(dst, src, std::size_t(n) * sizeof(T), cudaMemcpyHostToDevice));
  }
};

template <>
struct attention_backend<cuda> {
  template <class T, class C>
  static void forward(CudaExecutor& exec, const AttentionDims& d, const T* qkv, T* out, C* lse) {
    cu::causal_attention_forward(d, qkv, out, lse, exec.stream());
  }
  template <class T, class C>
  static void backward(CudaExecutor& exec, const AttentionDims& d, const T* qkv, const T* out, const T* dout,
                       const C* lse, T* dqkv, bool accumulate) {
    cu::causal_attention_backward(d, qkv, out, dout, lse, dqkv, accumulate, exec.stream());
  }
};

#if defined(KILN_HAVE_CUDNN)
// Convolution on kiln::cuda: cuDNN's graph API (kiln/backend/cuda/cudnn_conv.cuh), one cuDNN
// handle and plan cache per host thread (cuDNN handles are not to be shared across threads) and
// per precision policy, created on first use and kept for the process (never destroyed: at exit
// the CUDA context may already be gone). The policy is the executor's: under tf32 cuDNN may run
// fp32 convolutions on TF32 tensor cores, as cuBLASLt runs the GEMMs; under fp32 it may not —
// PyTorch's default allows TF32 in cuDNN (torch.backends.cudnn.allow_tf32), kiln's fp32 means
// fp32 products everywhere (README, "Convolutions").
template <>
struct conv_backend<cuda> {
  static cu::CudnnConv& conv(bool tf32) {
    thread_local cu::CudnnConv* exact = new cu::CudnnConv({.allow_tf32 = false});
    thread_local cu::CudnnConv* tensor_cores = new cu::CudnnConv({.allow_tf32 = true});
    return tf32 ? *tensor_cores : *exact;
  }
  template <class T>
  static void forward(CudaExecutor& exec, const cpu::Conv2dShape& s, const T* x, const T* w, T* y) {
    conv(exec.tf32()).forward(s, x, w, y, exec.stream());
  }
  template <class T>
  static void backward_data(CudaExecutor& exec, const cpu::Conv2dShape& s, const T* dy, const T* w, T* dx,
                            bool accumulate) {
    conv(exec.tf32()).backward_data(s, dy, w, dx, exec.stream(), accumulate);
  }
  template <class T>
  static void backward_filter(CudaExecutor& exec, const cpu::Conv2dShape& s, const T* x, const T* dy, T* dw,
                              bool accumulate) {
    conv(exec.tf32()).backward_filter(s, x, dy, dw, exec.stream(), accumulate);
  }
};
#endif

}  // namespace kiln::nn

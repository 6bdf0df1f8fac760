// kiln/nn/conv.hpp — 2-D convolution as an autograd op and a layer, NCHW, PyTorch's layout and
// initialisation ([Cout, Cin, K, K] weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and
// bias, fan_in = Cin*K*K).
//
//   using Net = nn::Sequential<nn::Unflatten<1, 20, 20>, nn::Conv2d<1, 16, 3, 1, 1>, nn::ReLU, ...>;
//
// Forward is ONE convolution whose epilogue adds the bias; forward_fused<Act> runs an activation
// in the same epilogue, act(conv(x) + b) — Sequential does this for every Conv2d followed by an
// activation, as for Linear. Backward: the activation's derivative (one pass, fused runs only),
// then backward-data (when the input needs a gradient) and backward-filter with the bias gradient.
// Channels and spatial sizes flow through the type (output_sample): a Conv2d whose Cin differs
// from the previous layer's channels is a static_assert, and with static input extents the
// output's H and W are static too.
//
// Where it runs: the CPU backend (kiln/backend/cpu/conv2d.hpp: chunked im2col + kiln's GEMM).
// Under mixed precision (bf16 / f16 activations, float master weights) a channels-last bf16
// convolution runs the bf16 GEMM on the activations and the weight's bf16 copy (AMX or vdpbf16ps
// where the CPU has them; kiln/backend/cpu/conv2d_nhwc_bf16.hpp); NCHW and f16 run the float
// kernels on widened values and the weight's half-precision copy (kiln/nn/half_io.hpp).
// The CUDA path (cuDNN) is not written yet; a model with a Conv2d on kiln::cuda is a
// static_assert saying so.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/autograd/remake.hpp"
#include "kiln/backend/cpu/conv2d.hpp"
#include "kiln/backend/cpu/conv2d_nhwc.hpp"
#include "kiln/backend/cpu/conv2d_nhwc_bf16.hpp"
#include "kiln/core/epilogue.hpp"
#include "kiln/core/random.hpp"
#include "kiln/nn/init.hpp"
#include "kiln/nn/convnet_functors.hpp"
#include "kiln/nn/empty_batch.hpp"
#include "kiln/nn/half_io.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/sample_shape.hpp"

namespace kiln::nn {

// Stride, padding and dilation of a square-kernel convolution (the same along both axes).
struct Conv2dGeometry {
  index_t kernel = 1, stride = 1, pad = 0, dilation = 1;
};

namespace detail {

}  // namespace detail

// How a device space convolves: forward(exec, shape, x, w, y), backward_data(exec, shape, dy, w, dx,
// accumulate) and backward_filter(exec, shape, x, dy, dw, accumulate), NCHW, on the executor's
// stream. kiln/nn/cuda.cuh gives kiln::cuda's (cuDNN, kiln/backend/cuda/cudnn_conv.cuh); the CPU
// runs kiln/backend/cpu/conv2d*.hpp directly.
template <class Space>
struct conv_backend {
  static_assert(dependent_false<Space>,
                "kiln::nn::Conv2d: no convolution backend for this memory space; for kiln::cuda include "
                "kiln/nn/cuda.cuh in a build that has cuDNN (KILN_HAVE_CUDNN)");
};

namespace detail {

// The kernels' shape of an input x ([N, C, H, W], or [N, H, W, C] in nhwc).
template <layout L>
cpu::Conv2dShape conv_shape(const Shape& x, index_t c_out, const Conv2dGeometry& g) {
  const bool last = L == layout::nhwc;
  return {.n = x[0], .c_in = x[last ? 3 : 1], .h = x[last ? 1 : 2], .w = x[last ? 2 : 3], .c_out = c_out,
          .kh = g.kernel, .kw = g.kernel, .stride_h = g.stride, .stride_w = g.stride, .pad_h = g.pad, .pad_w = g.pad,
          .dil_h = g.dilation, .dil_w = g.dilation};
}
inline const char* layout_dims(layout L) { return L == layout::nhwc ? "[N, H, W, C]" : "[N, C, H, W]"; }

// The kernels' shape of input x ([N, C, H, W] or [N, H, W, C]) and weight w ([Cout, Cin, K, K]),
// after checking that they fit together.
template <layout L>
cpu::Conv2dShape checked_conv_shape(const Shape& xs, const Shape& ws, const Conv2dGeometry& g) {
  constexpr bool nhwc = L == layout::nhwc;
  KILN_CHECK(xs.rank == 4, ShapeError, "conv2d: the input must be ", layout_dims(L), ", got shape ", xs.str());
  KILN_CHECK(ws.rank == 4 && xs[nhwc ? 3 : 1] == ws[1] && ws[2] == g.kernel && ws[3] == g.kernel, ShapeError,
             "conv2d: the input has shape ", xs.str(), " (", layout_dims(L), ") but the weight has shape ", ws.str(),
             " (kernel ", g.kernel, "): the input's channels must equal the weight's second size");
  return conv_shape<L>(xs, ws[0], g);
}

template <layout L, class T>
void conv_backward_data(const cpu::Conv2dShape& s, const T* dy, const T* w, T* dx, int threads,
                        bool accumulate = false) {
  if constexpr (L == layout::nhwc) cpu::conv2d_nhwc_backward_data(s, dy, w, dx, threads, accumulate);
  else cpu::conv2d_backward_data(s, dy, w, dx, threads, accumulate);
}

// Backward on a device: the activation's derivative (one kernel), backward-data and
// backward-filter through the backend (accumulating into gradients that hold a contribution), and
// the bias gradient as one per-channel reduction.
template <class Act, class Exec, class T, class XD, class WD, class BD>
void conv2d_backward_device(Exec& exec, const T* dy, XD& xd, WD& wd, BD* bd, const T* pre, const cpu::Conv2dShape& s,
                            const ImageIndex& ix, std::size_t y_bytes) {
  using S = typename Exec::space;
  const index_t y_size = s.n * s.c_out * s.out_h() * s.out_w(), m = s.n * s.out_h() * s.out_w();
  Tensor<T, S, dyn> dz;
  if constexpr (!is_identity_act_v<Act>) {
    dz = Tensor<T, S, dyn>(Shape{y_size});
    exec.for_each_element(1, y_size, ConvDAct<T, Act>{dy, pre, dz.data()}, kind::elementwise,
                          std::string("backward(") + Act::name + ")", y_bytes * 3);
    dy = dz.data();
  }
  if (xd.requires_grad) {
    exec.stats().count(kind::gemm, "conv2d_backward_data", xd.value.size(), y_bytes);
    const bool add = xd.grad_valid;
    conv_backend<S>::backward_data(exec, s, dy, wd.value.data(), xd.ensure_grad(), add);
    xd.grad_valid = true;
  }
  if (wd.requires_grad) {
    exec.stats().count(kind::gemm, "conv2d_backward_filter", wd.value.size(), y_bytes);
    const bool add = wd.grad_valid;
    conv_backend<S>::backward_filter(exec, s, xd.value.data(), dy, wd.ensure_grad(), add);
    wd.grad_valid = true;
  }
  if (bd && bd->requires_grad) {
    const bool add = bd->grad_valid;
    launch_lines<false>(exec, s.c_out, m, ConvBiasGradRows<T>{dy, bd->ensure_grad(), ix, m, add}, "conv2d_bias_grad",
                        y_bytes, kind::reduce);
    bd->grad_valid = true;
  }
}

// dst[i] = src[i] (add = false) or dst[i] += src[i].
template <class T>
void write_or_add(T* dst, const T* src, index_t n, bool add) {
  if (add) {
    for (index_t i = 0; i < n; ++i) dst[i] += src[i];
  } else {
    std::copy(src, src + n, dst);
  }
}

// "Conv2d<3, 64, 7, stride 2, pad 3, no bias>": one function for every layer configuration.
inline std::string describe_conv2d(bool nhwc, index_t cin, index_t cout, index_t kernel, index_t stride,
                                   index_t padding, index_t dilation, bool bias) {
  std::string d = nhwc ? "Conv2d[nhwc]<" : "Conv2d<";
  d.append(std::to_string(cin)).append(", ").append(std::to_string(cout)).append(", ").append(std::to_string(kernel));
  if (stride != 1) d.append(", stride ").append(std::to_string(stride));
  if (padding != 0) d.append(", pad ").append(std::to_string(padding));
  if (dilation != 1) d.append(", dilation ").append(std::to_string(dilation));
  return d.append(bias ? ">" : ", no bias>");
}

// The CPU convolution's epilogue: z + bias, then the activation, keeping the pre-activation in
// `keep` (nullable). A functor of the element type and the activation only, so the convolution
// driver it is handed to is compiled once per (T, Act), not once per layer (a lambda in
// conv2d_impl made it one per layer configuration).
template <class T, class Act>
struct ConvFinish {
  const T* bias;
  T* keep;
  index_t c_out, ohw;
  // One row of `len` outputs whose channels are co0, co0 + step, ...: NCHW one channel's plane
  // (step 0), NHWC one pixel's channels (step 1).
  void row(const T* z, T* y, T* k, index_t len, index_t co0, index_t step) const {
    for (index_t p = 0; p < len; ++p) {
      const T v = z[p] + (bias ? bias[co0 + p * step] : T(0));
      if constexpr (!is_identity_act_v<Act>) {
        if (k) k[p] = v;
        y[p] = Act{}(v);
      } else {
        y[p] = v;
      }
    }
  }
  // NCHW: image n's plane of channel co.
  void operator()(index_t n, index_t co, const T* z, T* y, index_t len) const {
    row(z, y, keep ? keep + (n * c_out + co) * ohw : nullptr, len, co, 0);
  }
  // y = z exactly: the NHWC convolution then lets its GEMM write y (conv2d_nhwc.hpp).
  bool copies_only() const { return bias == nullptr && is_identity_act_v<Act>; }
  // y = z + bias and nothing else (no activation, nothing kept): the bias, which the bf16 NHWC
  // convolution's GEMM then adds as it writes y (conv2d_nhwc_bf16.hpp); nullptr otherwise.
  const T* bias_only() const { return is_identity_act_v<Act> ? bias : nullptr; }
  // NHWC: one pixel's channels.
  void operator()(index_t pixel, const T* z, T* y, index_t len) const {
    row(z, y, keep ? keep + pixel * c_out : nullptr, len, 0, 1);
  }
};

// y = act(conv(x, w) + b) with x [N, Cin, H, W] (nhwc: [N, H, W, Cin]), w [Cout, Cin, K, K] in
// either layout, b [Cout] (bd null: none). Out is the result's variable type (the layer computes
// its static extents).
template <class Out, class Act, layout L = layout::nchw, class Exec, class T, class S, index_t... D, class WD, class BD>
Out conv2d_impl(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x, std::shared_ptr<WD> wd, std::shared_ptr<BD> bd,
                const Conv2dGeometry& g) {
  static_assert(std::is_same_v<S, typename Exec::space>,
                "kiln::nn::conv2d: the input must live in the executor's memory space");
  static_assert(std::is_same_v<S, host> || L == layout::nchw,
                "kiln::nn::conv2d: on a device, convolution runs NCHW only so far (cuDNN with channels-last "
                "tensors is not wired yet)");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "kiln::nn::conv2d: convolution takes float or double (no mixed precision yet)");
  constexpr bool nhwc = L == layout::nhwc;
  const Shape xs = x.shape();
  const cpu::Conv2dShape s = checked_conv_shape<L>(xs, wd->value.shape(), g);
  const Shape out_shape = nhwc ? Shape{s.n, s.out_h(), s.out_w(), s.c_out} : Shape{s.n, s.c_out, s.out_h(), s.out_w()};
  if (s.n == 0) {  // PyTorch's empty batch (nn/empty_batch.hpp); the other sizes are checked as for one image
    cpu::Conv2dShape one = s;
    one.n = 1;
    one.check("conv2d");
    return empty_batch_output<Out>(tape, out_shape, x, wd, bd);
  }
  s.check("conv2d");
  const index_t ohw = s.out_h() * s.out_w(), y_size = s.n * s.c_out * ohw;
  Out out{typename Out::tensor_type(out_shape)};
  const bool any = x.requires_grad() || wd->requires_grad || (bd && bd->requires_grad);
  const bool recording = any && tape.recording();
  constexpr bool has_act = !is_identity_act_v<Act>;
  // The pre-activation, kept for the activation's derivative in backward (fused runs only).
  auto pre = std::make_shared<Tensor<T, S, dyn>>(Shape{has_act && recording ? y_size : 0});
  const T* bias = bd ? bd->value.data() : nullptr;
  T* keep = pre->size() == 0 ? nullptr : pre->data();
  const ImageIndex ix{s.c_out, ohw, nhwc};
  const std::size_t x_bytes = std::size_t(xs.size()) * sizeof(T), y_bytes = std::size_t(y_size) * sizeof(T);
  tape.exec().stats().count(kind::gemm, has_act ? std::string("conv2d+bias+") + Act::name : std::string("conv2d"),
                            y_size, x_bytes + y_bytes);
  if constexpr (!std::is_same_v<S, host>) {
    // A device: the backend's convolution, then ONE kernel for bias + activation when there is
    // either.
    conv_backend<S>::forward(tape.exec(), s, x.value().data(), wd->value.data(), out.value().data());
    if (bias || has_act)
      tape.exec().for_each_element(1, y_size, ConvBiasAct<T, Act>{out.value().data(), keep, bias, ix}, kind::elementwise,
                                   has_act ? std::string("bias+") + Act::name : std::string("bias"), y_bytes * 2);
  } else {
  const ConvFinish<T, Act> finish{bias, keep, s.c_out, ohw};
  if constexpr (nhwc) cpu::conv2d_nhwc_forward_epilogue(s, x.value().data(), wd->value.data(), out.value().data(),
                                                        tape.exec().threads(), finish);
  else cpu::conv2d_forward_epilogue(s, x.value().data(), wd->value.data(), out.value().data(), tape.exec().threads(),
                                    finish);
  }
  if (!recording) return out;
  out.set_requires_grad(true);
  std::vector<std::shared_ptr<ag::VarNode>> inputs{x.data(), wd};
  if (bd) inputs.push_back(bd);
  tape.record(out, std::move(inputs), [xd = x.data(), wd, bd, pre, s, ix, y_size, x_bytes, y_bytes](Exec& exec, auto& od) {
    if (!od.grad_valid) return;
    if constexpr (!std::is_same_v<S, host>) {
      conv2d_backward_device<Act>(exec, od.grad.data(), *xd, *wd, bd.get(), pre->data(), s, ix, y_bytes);
      return;
    } else {
    const int threads = exec.threads();
    const T* dy = od.grad.data();
    std::vector<T> dz;
    if constexpr (has_act) {
      exec.stats().count(kind::elementwise, std::string("backward(") + Act::name + ")", y_size, y_bytes * 3);
      dz.resize(std::size_t(y_size));
      const T* z = pre->data();
      for (index_t i = 0; i < y_size; ++i) dz[std::size_t(i)] = dy[i] * Act{}.d(z[i]);
      dy = dz.data();
    }
    if (xd->requires_grad) {
      exec.stats().count(kind::gemm, "conv2d_backward_data", s.n * s.c_in * s.h * s.w, x_bytes + y_bytes);
      // Added straight into a gradient that holds a contribution (a skip connection's).
      const bool add = xd->grad_valid;
      conv_backward_data<L>(s, dy, wd->value.data(), xd->ensure_grad(), threads, add);
      xd->grad_valid = true;
    }
    const bool dw = wd->requires_grad, db = bd && bd->requires_grad;
    if (dw || db) {
      exec.stats().count(kind::gemm, "conv2d_backward_filter", wd->value.size(), x_bytes + y_bytes);
      const index_t wn = wd->value.size();
      std::vector<T> gw(static_cast<std::size_t>(wn)), gb(static_cast<std::size_t>(s.c_out));
      Tensor<T, host, dyn> remade;  // x made again when it was freed after forward (autograd/remake.hpp)
      const T* X = ag::value_or_remade(*xd, remade, threads);
      if constexpr (nhwc) {
        cpu::conv2d_nhwc_backward_filter(s, X, dy, gw.data(), db ? gb.data() : nullptr, threads);
      } else {
        cpu::conv2d_backward_filter(s, X, dy, gw.data(), db ? gb.data() : nullptr, threads);
      }
      if (dw) {
        const bool add = wd->grad_valid;
        write_or_add(wd->ensure_grad(), gw.data(), wn, add);
        wd->grad_valid = true;
      }
      if (db) {
        const bool add = bd->grad_valid;
        write_or_add(bd->ensure_grad(), gb.data(), s.c_out, add);
        bd->grad_valid = true;
      }
    }
    }
  });
  return out;
}

// conv2d_impl under mixed precision (nn/half_io.hpp): x, the output and the kept pre-activation
// in X (bf16 / f16), the weight read from its X copy `low` (so the products are the half-precision
// ones), the float kernels on widened buffers that live for the call, the weight's and the bias's
// gradients in float. The CPU only so far.
template <class Out, class Act, layout L, class Exec, class X, class S, index_t... D, class WD, class BD, class Low>
Out conv2d_half_impl(ag::Tape<Exec>& tape, const ag::Var<X, S, D...>& x, std::shared_ptr<WD> wd, std::shared_ptr<BD> bd,
                     std::shared_ptr<Low> low, const Conv2dGeometry& g) {
  static_assert(std::is_same_v<S, host>,
                "kiln::nn::Conv2d: bf16 / f16 activations run on the CPU so far (cuDNN's half-precision path is not "
                "written yet): use fp32 or tf32 on the device");
  constexpr bool nhwc = L == layout::nhwc;
  // Channels-last bf16 runs the bf16 GEMM on the values as they are (AMX / vdpbf16ps,
  // cpu/conv2d_nhwc_bf16.hpp); NCHW and f16 widen to float first.
  constexpr bool bf16_gemm = nhwc && std::is_same_v<X, bf16>;
  const Shape xs = x.shape();
  const cpu::Conv2dShape s = checked_conv_shape<L>(xs, wd->value.shape(), g);
  const Shape out_shape = nhwc ? Shape{s.n, s.out_h(), s.out_w(), s.c_out} : Shape{s.n, s.c_out, s.out_h(), s.out_w()};
  if (s.n == 0) {
    cpu::Conv2dShape one = s;
    one.n = 1;
    one.check("conv2d");
    return empty_batch_output<Out>(tape, out_shape, x, wd, bd);
  }
  s.check("conv2d");
  KILN_CHECK(low != nullptr, ValueError, "conv2d: a ", kiln::name(dtype_of<X>), " input needs the weight's ",
             kiln::name(dtype_of<X>), " copy; call refresh_low_copy (a train::Step does)");
  const index_t ohw = s.out_h() * s.out_w(), y_size = s.n * s.c_out * ohw;
  Out out{typename Out::tensor_type(out_shape)};
  const bool any = x.requires_grad() || wd->requires_grad || (bd && bd->requires_grad);
  const bool recording = any && tape.recording();
  constexpr bool has_act = !is_identity_act_v<Act>;
  const std::size_t x_bytes = std::size_t(xs.size()) * sizeof(X), y_bytes = std::size_t(y_size) * sizeof(X);
  tape.exec().stats().count(kind::gemm, has_act ? std::string("conv2d+bias+") + Act::name : std::string("conv2d"),
                            y_size, x_bytes + y_bytes);
  {
    const int threads = tape.exec().threads();
    scratch_vector<float> keep(has_act && recording ? std::size_t(y_size) : 0);
    const ConvFinish<float, Act> finish{bd ? bd->value.data() : nullptr, keep.empty() ? nullptr : keep.data(), s.c_out,
                                        ohw};
    if constexpr (bf16_gemm) {  // rounded into y row by row
      cpu::conv2d_nhwc_bf16_forward_epilogue(s, x.value().data(), low->data(), out.value().data(), threads, finish);
    } else {
      scratch_vector<float> yf(static_cast<std::size_t>(y_size));
      const auto wf = widened(low->data(), low->size(), threads);
      const auto xf = widened(x.value().data(), xs.size(), threads);
      if constexpr (nhwc) cpu::conv2d_nhwc_forward_epilogue(s, xf.data(), wf.data(), yf.data(), threads, finish);
      else cpu::conv2d_forward_epilogue(s, xf.data(), wf.data(), yf.data(), threads, finish);
      store_rounded(out.value().data(), yf.data(), y_size, false, threads);
    }
    if (!recording) return out;
    auto pre = std::make_shared<std::vector<X>>(keep.size());
    store_rounded(pre->data(), keep.data(), index_t(keep.size()), false, threads);
    out.set_requires_grad(true);
    std::vector<std::shared_ptr<ag::VarNode>> inputs{x.data(), wd};
    if (bd) inputs.push_back(bd);
    tape.record(out, std::move(inputs), [xd = x.data(), wd, bd, pre, low, s, y_size, x_bytes, y_bytes](Exec& exec, auto& od) {
      if (!od.grad_valid) return;
      const int threads = exec.threads();
      // The weight's and bias's float gradients, written or added.
      auto put_filter_grads = [&](const float* gw, const float* gb) {
        if (wd->requires_grad) {
          write_or_add(wd->ensure_grad(), gw, wd->value.size(), wd->grad_valid);
          wd->grad_valid = true;
        }
        if (bd && bd->requires_grad) {
          write_or_add(bd->ensure_grad(), gb, s.c_out, bd->grad_valid);
          bd->grad_valid = true;
        }
      };
      if constexpr (bf16_gemm) {
        // dy in bf16, as the GEMM reads it: the output's gradient itself, or times the
        // activation's derivative, rounded.
        scratch_vector<X> dy_act;
        const X* dy = od.grad.data();
        if constexpr (has_act) {
          exec.stats().count(kind::elementwise, std::string("backward(") + Act::name + ")", y_size, y_bytes * 3);
          dy_act.resize(std::size_t(y_size));
          for (index_t i = 0; i < y_size; ++i)
            dy_act[std::size_t(i)] = X(float(dy[i]) * Act{}.d(static_cast<float>((*pre)[std::size_t(i)])));
          dy = dy_act.data();
        }
        if (xd->requires_grad) {
          exec.stats().count(kind::gemm, "conv2d_backward_data", s.n * s.c_in * s.h * s.w, x_bytes + y_bytes);
          cpu::conv2d_nhwc_bf16_backward_data(s, dy, low->data(), xd->ensure_grad(), threads, xd->grad_valid);
          xd->grad_valid = true;
        }
        const bool dw = wd->requires_grad, db = bd && bd->requires_grad;
        if (dw || db) {
          exec.stats().count(kind::gemm, "conv2d_backward_filter", wd->value.size(), x_bytes + y_bytes);
          const index_t wn = wd->value.size();
          scratch_vector<float> gw(static_cast<std::size_t>(wn)), gb(static_cast<std::size_t>(s.c_out));
          cpu::conv2d_nhwc_bf16_backward_filter(s, xd->value.data(), dy, gw.data(), db ? gb.data() : nullptr, threads);
          put_filter_grads(gw.data(), gb.data());
        }
        return;
      }
      scratch_vector<float> dy = widened(od.grad.data(), y_size, threads);
      if constexpr (has_act) {
        exec.stats().count(kind::elementwise, std::string("backward(") + Act::name + ")", y_size, y_bytes * 3);
        for (index_t i = 0; i < y_size; ++i) dy[std::size_t(i)] *= Act{}.d(static_cast<float>((*pre)[std::size_t(i)]));
      }
      if (xd->requires_grad) {
        exec.stats().count(kind::gemm, "conv2d_backward_data", s.n * s.c_in * s.h * s.w, x_bytes + y_bytes);
        const auto wf = widened(low->data(), low->size(), threads);
        put_rounded_input_grad(
            *xd, [&](float* dx) { conv_backward_data<L>(s, dy.data(), wf.data(), dx, threads); }, threads);
      }
      const bool dw = wd->requires_grad, db = bd && bd->requires_grad;
      if (dw || db) {
        exec.stats().count(kind::gemm, "conv2d_backward_filter", wd->value.size(), x_bytes + y_bytes);
        const index_t wn = wd->value.size();
        const auto xf = widened(xd->value.data(), xd->value.size(), threads);
        scratch_vector<float> gw(static_cast<std::size_t>(wn)), gb(static_cast<std::size_t>(s.c_out));
        if constexpr (L == layout::nhwc)
          cpu::conv2d_nhwc_backward_filter(s, xf.data(), dy.data(), gw.data(), db ? gb.data() : nullptr, threads);
        else cpu::conv2d_backward_filter(s, xf.data(), dy.data(), gw.data(), db ? gb.data() : nullptr, threads);
        put_filter_grads(gw.data(), gb.data());
      }
    });
  }
  return out;
}

}  // namespace detail

// y = conv2d(x, weight, bias): x [N, Cin, H, W], weight [Cout, Cin, K, K], bias [Cout].
template <class Exec, class T, class S, index_t... D, index_t... W, index_t... Bd>
ag::Var<T, S, dyn, dyn, dyn, dyn> conv2d(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x,
                                         const ag::Var<T, S, W...>& weight, const ag::Var<T, S, Bd...>& bias,
                                         Conv2dGeometry g) {
  KILN_CHECK(bias.shape().rank == 1 && bias.dim(0) == weight.dim(0), ShapeError, "conv2d: the weight has shape ",
             weight.shape().str(), " so the bias needs shape [", weight.dim(0), "], got ", bias.shape().str());
  return detail::conv2d_impl<ag::Var<T, S, dyn, dyn, dyn, dyn>, fn::Identity>(tape, x, weight.data(), bias.data(), g);
}
// Without a bias.
template <class Exec, class T, class S, index_t... D, index_t... W>
ag::Var<T, S, dyn, dyn, dyn, dyn> conv2d(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x,
                                         const ag::Var<T, S, W...>& weight, Conv2dGeometry g) {
  using None = std::shared_ptr<typename ag::Var<T, S, dyn>::data_type>;
  return detail::conv2d_impl<ag::Var<T, S, dyn, dyn, dyn, dyn>, fn::Identity>(tape, x, weight.data(), None(), g);
}

namespace detail {
// Instantiated per layer and input sample, so the compiler names both when a check fails.
template <class Layer, class In>
struct conv_accepts {
  static_assert(dependent_false<In>,
                "kiln::nn::Conv2d: the input must be an image [C, H, W]; a flat input needs nn::Unflatten<C, H, W> "
                "first (conv_accepts<Layer, sample<...>> names the sizes)");
  using type = any_sample;
};
template <class Layer>
struct conv_accepts<Layer, any_sample> {
  using type = sample<Layer::out_channels, dyn, dyn>;
};
template <class Layer, index_t C, index_t H, index_t W>
struct conv_accepts<Layer, sample<C, H, W>> {
  static_assert(C == dyn || C == Layer::in_channels,
                "kiln::nn::Conv2d: the input's channels differ from the layer's Cin (conv_accepts<Conv2d<Cin, ...>, "
                "sample<C, H, W>> names both)");
  static_assert((H == dyn || H + 2 * Layer::padding >= Layer::span) && (W == dyn || W + 2 * Layer::padding >= Layer::span),
                "kiln::nn::Conv2d: the image (plus padding) is smaller than the kernel (conv_accepts<Conv2d<...>, "
                "sample<C, H, W>> names the sizes)");
  using type = sample<Layer::out_channels, window_output(H, Layer::kernel, Layer::stride, Layer::padding, Layer::dilation),
                      window_output(W, Layer::kernel, Layer::stride, Layer::padding, Layer::dilation)>;
};

}  // namespace detail

// Conv2d<Cin, Cout, Kernel, Stride, Padding, Dilation, Bias>: a square kernel, the same stride,
// padding and dilation along both axes (PyTorch's argument order; groups are not offered).
// Layout says how its input and output hold images (the weight is [Cout, Cin, K, K] in both).
template <index_t Cin, index_t Cout, index_t Kernel, index_t Stride = 1, index_t Padding = 0, index_t Dilation = 1,
          bool Bias = true, class T = float, class Space = host, layout Layout = layout::nchw>
class Conv2d {
  static_assert(Cin > 0 && Cout > 0 && Kernel > 0 && Stride > 0 && Dilation > 0 && Padding >= 0,
                "kiln::nn::Conv2d<Cin, Cout, Kernel, Stride, Padding, Dilation>: channels, kernel, stride and "
                "dilation must be positive and padding non-negative");

 public:
  static constexpr index_t in_channels = Cin, out_channels = Cout, kernel = Kernel, stride = Stride,
                           padding = Padding, dilation = Dilation, span = Dilation * (Kernel - 1) + 1;
  static constexpr bool has_bias = Bias;
  static constexpr bool fuses_activation = true;
  using value_type = T;
  using space = Space;
  template <class S>
  using on = Conv2d<Cin, Cout, Kernel, Stride, Padding, Dilation, Bias, T, S, Layout>;
  template <layout L>
  using with_layout = Conv2d<Cin, Cout, Kernel, Stride, Padding, Dilation, Bias, T, Space, L>;
  static constexpr layout image_layout = Layout;
  template <class In>
  using output_sample = typename detail::conv_accepts<Conv2d, In>::type;
  // The layer's own type, or bf16 / f16 when T is float (mixed precision, nn/half_io.hpp).
  template <class X>
  static constexpr bool accepts_input = std::is_same_v<X, T> || (kiln::detail::is_half_v<X> && std::is_same_v<T, float>);

  // Weight, then bias, from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = Cin*K*K (PyTorch's
  // reset_parameters), drawn on the host and moved into Space.
  explicit Conv2d(Generator& gen) : weight_(init_weight(gen), true), bias_(init_bias(gen)) {}
  explicit Conv2d(std::uint64_t seed = 0) : Conv2d(lvalue(Generator(seed))) {}

  template <class Exec, class X, index_t B, index_t D1, index_t D2, index_t D3>
    requires accepts_input<X>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<X, Space, B, D1, D2, D3>& x) const {
    return run<fn::Identity>(tape, x);
  }
  // act(conv(x) + b) in ONE pass; Act is an activation layer with a kiln::fn functor.
  template <class Act, class Exec, class X, index_t B, index_t D1, index_t D2, index_t D3>
    requires accepts_input<X>
  auto forward_fused(ag::Tape<Exec>& tape, const ag::Var<X, Space, B, D1, D2, D3>& x) const {
    static_assert(requires { typename Act::functor; },
                  "kiln::nn::Conv2d::forward_fused<Act>: the activation must name its kiln::fn functor "
                  "(kiln::nn::Activation<F>)");
    if (tape.force_eager()) {  // two kernels, as asked (kiln/force_eager.hpp)
      using XV = std::decay_t<decltype(x)>;
      using Y = decltype(run<typename Act::functor>(tape, x));
      return kiln::ag::detail::run_eager_form(&detail::forward_fused_eager<Act, Conv2d, Exec, XV, Y>,
                                              "Conv2d::forward_fused", *this, tape, x);
    }
    return run<typename Act::functor>(tape, x);
  }

  // Forward ONE convolution (with its epilogue); backward the activation's derivative when one is
  // fused, backward-filter (with the bias gradient), and backward-data when the input needs it.
  template <class Act = void>
  static constexpr Launches launches_fused(const LaunchContext& c) {
    constexpr bool act = applies_activation<Act>();
    // force_eager runs the activation as its own kernel each way instead of in the epilogue. A
    // device runs the bias and the activation as one kernel after the library's convolution, and
    // the bias gradient as a reduction of its own.
    // Frozen (c.weight_grad / c.bias_grad false): the filter's and the bias's gradients are left
    // out, and the whole backward when no gradient is due.
    const index_t dx = c.input_grad ? 1 : 0;
    const bool dw = c.weight_grad, db = Bias && c.bias_grad, any = c.input_grad || dw || db;
    if (c.device) {
      const bool epilogue = Bias || (act && !c.eager);
      return {1 + index_t(epilogue) + index_t(act && c.eager),
              any ? index_t(act) + index_t(dw) + index_t(db) + dx : 0};
    }
    return {1 + index_t(act && c.eager), any ? index_t(act) + index_t(dw || db) + dx : 0};
  }
  static constexpr Launches launches(const LaunchContext& c) { return launches_fused<void>(c); }
  static constexpr index_t parameter_tensors = Bias ? 2 : 1;
  // Runs on bf16 / f16 activations with float master parameters (train::Step's mixed precisions,
  // on the CPU), keeping one low-precision copy of its weight.
  static constexpr bool mixed_precision = true;
  static constexpr index_t low_copies = 1;
  // Its backward reads its input only through ag::value_or_remade: nn::Sequential may free an
  // input that can be made again (a batch norm's output) once this layer ran forward.
  static constexpr bool remakes_input = true;

  // Mixed precision: the weight's values in L (bf16 or f16), rounded from the float master weight
  // by ONE kernel; a training step calls it at start and after every optimizer step.
  template <class L, class Exec>
  void refresh_low_copy(Exec& exec) const {
    static_assert(std::is_same_v<L, bf16> || std::is_same_v<L, f16>, "kiln::nn::Conv2d: low copies are bf16 or f16");
    auto& slot = low_slot<L>();
    if (!slot) slot = std::make_shared<Tensor<L, Space, Cout, Cin, Kernel, Kernel>>();
    constexpr index_t n = Cout * Cin * Kernel * Kernel;
    exec.for_each_element(1, n, detail::RoundCopy<T, L>{weight_.value().data(), slot->data()}, kind::copy,
                          "round_weight", std::size_t(n) * (sizeof(T) + sizeof(L)));
  }

  static std::string describe() {
    return detail::describe_conv2d(Layout == layout::nhwc, Cin, Cout, Kernel, Stride, Padding, Dilation, Bias);
  }

  template <class F>
  void for_each_parameter(F&& f) const {
    f(weight_);
    if constexpr (Bias) f(bias_);
  }
  const ag::Var<T, Space, Cout, Cin, Kernel, Kernel>& weight() const { return weight_; }
  const ag::Var<T, Space, Cout>& bias() const
    requires Bias
  {
    return bias_;
  }

 private:
  static Generator& lvalue(Generator&& g) { return g; }
  static constexpr index_t fan_in = Cin * Kernel * Kernel;

  static Tensor<T, Space, Cout, Cin, Kernel, Kernel> init_weight(Generator& gen) {
    ag::Var<T, host, Cout, Cin, Kernel, Kernel> w;
    init::kaiming_uniform(w, gen, fan_in);
    return space_ops<Space>::from_host(std::move(w.value()));
  }
  static auto init_bias(Generator& gen) {
    if constexpr (Bias) {
      ag::Var<T, host, Cout> b;
      init::uniform(b, gen, -1.0 / std::sqrt(double(fan_in)), 1.0 / std::sqrt(double(fan_in)));
      return ag::Var<T, Space, Cout>(space_ops<Space>::from_host(std::move(b.value())), true);
    } else {
      return nullptr;
    }
  }

  template <class Act, class Exec, class X, index_t B, index_t D1, index_t D2, index_t D3>
  auto run(ag::Tape<Exec>& tape, const ag::Var<X, Space, B, D1, D2, D3>& x) const {
    using Out = image_var_t<X, Space, B, output_sample<image_sample_t<Layout, D1, D2, D3>>, Layout>;
    using None = std::shared_ptr<typename ag::Var<T, Space, Cout>::data_type>;
    const Conv2dGeometry g{Kernel, Stride, Padding, Dilation};
    if constexpr (!std::is_same_v<X, T>) {
      if constexpr (Bias) return detail::conv2d_half_impl<Out, Act, Layout>(tape, x, weight_.data(), bias_.data(), low_slot<X>(), g);
      else return detail::conv2d_half_impl<Out, Act, Layout>(tape, x, weight_.data(), None(), low_slot<X>(), g);
    } else if constexpr (Bias) {
      return detail::conv2d_impl<Out, Act, Layout>(tape, x, weight_.data(), bias_.data(), g);
    } else {
      return detail::conv2d_impl<Out, Act, Layout>(tape, x, weight_.data(), None(), g);
    }
  }
  template <class L>
  auto& low_slot() const {
    if constexpr (std::is_same_v<L, bf16>) return low_bf16_;
    else return low_f16_;
  }

  ag::Var<T, Space, Cout, Cin, Kernel, Kernel> weight_;
  [[no_unique_address]] std::conditional_t<Bias, ag::Var<T, Space, Cout>, std::nullptr_t> bias_;
  // The weight in bf16 / f16 for mixed precision (shared like the parameters), made by the first
  // refresh_low_copy.
  mutable std::shared_ptr<Tensor<bf16, Space, Cout, Cin, Kernel, Kernel>> low_bf16_;
  mutable std::shared_ptr<Tensor<f16, Space, Cout, Cin, Kernel, Kernel>> low_f16_;
};

}  // namespace kiln::nn

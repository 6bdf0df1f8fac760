// kiln/nn/pool.hpp — pooling layers on [N, C, H, W], PyTorch's semantics (floor mode; max pool's
// first maximum wins ties and NaN propagates; average pool's count_include_pad):
//   MaxPool2d<Kernel, Stride = Kernel, Padding = 0>
//   AvgPool2d<Kernel, Stride = Kernel, Padding = 0, CountIncludePad = true>
//   GlobalAvgPool: [N, C, H, W] -> [N, C] (AdaptiveAvgPool2d(1) + Flatten in PyTorch).
// Each is ONE pass forward and ONE backward (when the input needs a gradient); max pool's
// backward finds each window's maximum again in its input (no argmax kept). CPU backend
// (kiln/backend/cpu/pool2d.hpp); the CUDA path (cuDNN) is not written yet.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/autograd/remake.hpp"
#include "kiln/backend/cpu/pool2d.hpp"
#include "kiln/backend/cpu/pool2d_nhwc.hpp"
#include "kiln/nn/convnet_functors.hpp"
#include "kiln/nn/empty_batch.hpp"
#include "kiln/nn/half_io.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/sample_shape.hpp"

namespace kiln::nn {

namespace detail {

template <class Layer, class In>
struct pool_accepts {
  static_assert(dependent_false<In>,
                "kiln::nn: a pooling layer needs an image input [C, H, W] (pool_accepts<Layer, sample<...>> names the "
                "sizes)");
  using type = In;
};
template <class Layer>
struct pool_accepts<Layer, any_sample> {
  using type = any_sample;
};
template <class Layer, index_t C, index_t H, index_t W>
struct pool_accepts<Layer, sample<C, H, W>> {
  static_assert((H == dyn || H + 2 * Layer::padding >= Layer::kernel) &&
                    (W == dyn || W + 2 * Layer::padding >= Layer::kernel),
                "kiln::nn: the image (plus padding) is smaller than the pooling window (pool_accepts<Layer, "
                "sample<C, H, W>> names the sizes)");
  using type = sample<C, window_output(H, Layer::kernel, Layer::stride, Layer::padding),
                      window_output(W, Layer::kernel, Layer::stride, Layer::padding)>;
};

template <class Exec, class S>
void check_pool_space() {
  static_assert(std::is_same_v<S, typename Exec::space>, "kiln::nn: the input must live in the executor's memory space");
}

// Adds the gradient computed by `compute(dst)` into xd's gradient (or writes it when none is
// valid yet).
template <class Node, class F>
void put_input_grad(Node& xd, const F& compute) {
  const index_t n = xd.value.size();
  if (xd.grad_valid) {
    std::vector<typename std::remove_reference_t<decltype(*xd.value.data())>> tmp(static_cast<std::size_t>(n));
    compute(tmp.data());
    auto* g = xd.ensure_grad();
    for (index_t i = 0; i < n; ++i) g[i] += tmp[std::size_t(i)];
  } else {
    compute(xd.ensure_grad());
  }
  xd.grad_valid = true;
}

// The shared body of MaxPool2d and AvgPool2d, in the layer's layout.
template <class Layer, bool Max, class Exec, class T, class S, index_t B, index_t D1, index_t D2, index_t D3>
auto pool2d(ag::Tape<Exec>& tape, const ag::Var<T, S, B, D1, D2, D3>& x) {
  check_pool_space<Exec, S>();
  constexpr layout L = Layer::image_layout;
  constexpr bool nhwc = L == layout::nhwc;
  using Out = image_var_t<T, S, B, typename pool_accepts<Layer, image_sample_t<L, D1, D2, D3>>::type, L>;
  const Shape xs = x.shape();
  KILN_CHECK(xs.rank == 4, ShapeError, Layer::describe(), ": the input must be ",
             nhwc ? "[N, H, W, C]" : "[N, C, H, W]", ", got ", xs.str());
  const cpu::Pool2dShape s{.n = xs[0], .c = xs[nhwc ? 3 : 1], .h = xs[nhwc ? 1 : 2], .w = xs[nhwc ? 2 : 3],
                           .kh = Layer::kernel, .kw = Layer::kernel, .stride_h = Layer::stride,
                           .stride_w = Layer::stride, .pad_h = Layer::padding, .pad_w = Layer::padding};
  const Shape out_shape = nhwc ? Shape{s.n, s.out_h(), s.out_w(), s.c} : Shape{s.n, s.c, s.out_h(), s.out_w()};
  if (s.n == 0) {  // PyTorch's empty batch (nn/empty_batch.hpp); the other sizes are checked as for one image
    cpu::Pool2dShape one = s;
    one.n = 1;
    one.check(Layer::name);
    return empty_batch_output<Out>(tape, out_shape, x);
  }
  s.check(Layer::name);
  Out out{typename Out::tensor_type(out_shape)};
  const index_t y_size = out.value().size();
  const std::size_t bytes = std::size_t(xs.size() + y_size) * sizeof(T);
  if constexpr (std::is_same_v<S, host>) tape.exec().stats().count(kind::other, Layer::name, y_size, bytes);
  const bool record = x.requires_grad() && tape.recording();
  if constexpr (!std::is_same_v<S, host>) {
    static_assert(!kiln::detail::is_half_v<T>, "kiln::nn pooling: bf16 / f16 activations run on the CPU so far "
                                              "(the device's half-precision convnet path is not written yet)");
    // A device: one thread per output forward, one per input backward (a gather; max pool
    // recomputes its window's maximum from x instead of storing it).
    const PoolGeometry g{s.n, s.c, s.h, s.w, s.out_h(), s.out_w(), Layer::kernel, Layer::stride, Layer::padding, nhwc};
    const T* X = x.value().data();
    if constexpr (Max) {
      tape.exec().for_each_element(1, y_size, MaxPoolForward<T>{X, out.value().data(), nullptr, g}, kind::other,
                                   Layer::name, bytes);
    } else {
      tape.exec().for_each_element(1, y_size, AvgPoolForward<T>{X, out.value().data(), g, Layer::count_include_pad},
                                   kind::other, Layer::name, bytes);
    }
    if (!record) return out;
    out.set_requires_grad(true);
    tape.record(out, {x.data()}, [xd = x.data(), g, bytes](Exec& exec, auto& od) {
      if (!od.grad_valid || !xd->requires_grad) return;
      const bool add = xd->grad_valid;
      const index_t n = xd->value.size();
      const std::string name = std::string(Layer::name) + "_backward";
      if constexpr (Max) {
        exec.for_each_element(1, n, MaxPoolBackward<T>{xd->value.data(), od.grad.data(), xd->ensure_grad(), g, add},
                              kind::other, name, bytes);
      } else {
        exec.for_each_element(1, n,
                              AvgPoolBackward<T>{od.grad.data(), xd->ensure_grad(), g, Layer::count_include_pad, add},
                              kind::other, name, bytes);
      }
      xd->grad_valid = true;
    });
    return out;
  } else {  // the host (an else, so none of this is compiled for a device's space)
  // The CPU kernels, on float or double (a half-precision input runs them on widened values,
  // nn/half_io.hpp: max pooling picks the same element, average pooling sums in float).
  auto forward_kernel = [&](const auto* X, auto* Y) {
    if constexpr (Max && nhwc) cpu::max_pool2d_nhwc_forward(s, X, Y, nullptr);
    else if constexpr (Max) cpu::max_pool2d_forward(s, X, Y, nullptr);
    else if constexpr (nhwc) cpu::avg_pool2d_nhwc_forward(s, X, Y, Layer::count_include_pad);
    else cpu::avg_pool2d_forward(s, X, Y, Layer::count_include_pad);
  };
  // Channels-last bf16 max pooling reads and writes bf16 itself (exact: a maximum is an input).
  constexpr bool direct_bf16 = Max && nhwc && std::is_same_v<T, bf16>;
  if constexpr (direct_bf16) {
    cpu::max_pool2d_nhwc_forward(s, x.value().data(), out.value().data());
  } else if constexpr (kiln::detail::is_half_v<T>) {
    const int threads = tape.exec().threads();
    const auto xf = widened(x.value().data(), xs.size(), threads);
    scratch_vector<float> yf(static_cast<std::size_t>(y_size));
    forward_kernel(xf.data(), yf.data());
    store_rounded(out.value().data(), yf.data(), y_size, false, threads);
  } else {
    forward_kernel(x.value().data(), out.value().data());
  }
  if (!record) return out;
  out.set_requires_grad(true);
  // Max pooling's backward finds each window's maximum again in x (held for backward in any case)
  // rather than keeping an int64 argmax per output (1.6 MB per image at ResNet-50's stem), as
  // the device path does.
  tape.record(out, {x.data()}, [xd = x.data(), s, bytes, y_size](Exec& exec, auto& od) {
    if (!od.grad_valid || !xd->requires_grad) return;
    exec.stats().count(kind::other, std::string(Layer::name) + "_backward", xd->value.size(), bytes);
    auto backward_kernel = [&](const auto* X, const auto* G, auto* dx) {
      if constexpr (Max && nhwc) cpu::max_pool2d_nhwc_backward_from_input(s, X, G, dx);
      else if constexpr (Max) cpu::max_pool2d_backward_from_input(s, X, G, dx);
      else if constexpr (nhwc) cpu::avg_pool2d_nhwc_backward(s, G, dx, Layer::count_include_pad);
      else cpu::avg_pool2d_backward(s, G, dx, Layer::count_include_pad);
    };
    if constexpr (direct_bf16) {  // x and dy read as bf16, dx summed in float and rounded
      put_rounded_input_grad(
          *xd, [&](float* dx) { cpu::max_pool2d_nhwc_backward_from_input<float>(s, xd->value.data(), od.grad.data(), dx); },
          exec.threads());
    } else if constexpr (kiln::detail::is_half_v<T>) {
      // Max pooling picks the same element in the widened input as the forward did.
      const scratch_vector<float> xf = Max ? widened(xd->value.data(), xd->value.size(), exec.threads())
                                           : scratch_vector<float>{};
      const auto gf = widened(od.grad.data(), y_size, exec.threads());
      put_rounded_input_grad(*xd, [&](float* dx) { backward_kernel(xf.data(), gf.data(), dx); }, exec.threads());
    } else {
      const T* G = od.grad.data();
      Tensor<T, host, dyn> remade;  // x made again when it was freed after forward (autograd/remake.hpp)
      const T* X = Max ? ag::value_or_remade(*xd, remade, exec.threads()) : nullptr;
      put_input_grad(*xd, [&](T* dx) { backward_kernel(X, G, dx); });
    }
  });
  return out;
  }
}

}  // namespace detail

template <index_t Kernel, index_t Stride = Kernel, index_t Padding = 0, layout Layout = layout::nchw>
struct MaxPool2d {
  static_assert(Kernel > 0 && Stride > 0 && Padding >= 0 && 2 * Padding <= Kernel,
                "kiln::nn::MaxPool2d<Kernel, Stride, Padding>: kernel and stride must be positive and padding at "
                "most half the kernel");
  static constexpr index_t kernel = Kernel, stride = Stride, padding = Padding;
  static constexpr const char* name = "max_pool2d";
  static constexpr layout image_layout = Layout;
  template <layout L>
  using with_layout = MaxPool2d<Kernel, Stride, Padding, L>;
  template <class In>
  using output_sample = typename detail::pool_accepts<MaxPool2d, In>::type;

  template <class Exec, class T, class S, index_t B, index_t D1, index_t D2, index_t D3>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<T, S, B, D1, D2, D3>& x) const {
    return detail::pool2d<MaxPool2d, true>(tape, x);
  }
  static constexpr Launches launches(const LaunchContext& c) { return {1, c.input_grad ? 1 : 0}; }
  // Runs on bf16 / f16 activations (train::Step's mixed precisions; nn/half_io.hpp).
  static constexpr bool mixed_precision = true;
  // Its backward reads its input only through ag::value_or_remade (nn::Sequential may free it).
  static constexpr bool remakes_input = true;
  static std::string describe() {
    return std::string(Layout == layout::nhwc ? "MaxPool2d[nhwc]<" : "MaxPool2d<") + std::to_string(Kernel) + (Stride != Kernel ? ", stride " + std::to_string(Stride) : "") +
           (Padding ? ", pad " + std::to_string(Padding) : "") + ">";
  }
};

template <index_t Kernel, index_t Stride = Kernel, index_t Padding = 0, bool CountIncludePad = true,
          layout Layout = layout::nchw>
struct AvgPool2d {
  static_assert(Kernel > 0 && Stride > 0 && Padding >= 0 && 2 * Padding <= Kernel,
                "kiln::nn::AvgPool2d<Kernel, Stride, Padding>: kernel and stride must be positive and padding at "
                "most half the kernel");
  static constexpr index_t kernel = Kernel, stride = Stride, padding = Padding;
  static constexpr bool count_include_pad = CountIncludePad;
  static constexpr const char* name = "avg_pool2d";
  static constexpr layout image_layout = Layout;
  template <layout L>
  using with_layout = AvgPool2d<Kernel, Stride, Padding, CountIncludePad, L>;
  template <class In>
  using output_sample = typename detail::pool_accepts<AvgPool2d, In>::type;

  template <class Exec, class T, class S, index_t B, index_t D1, index_t D2, index_t D3>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<T, S, B, D1, D2, D3>& x) const {
    return detail::pool2d<AvgPool2d, false>(tape, x);
  }
  static constexpr Launches launches(const LaunchContext& c) { return {1, c.input_grad ? 1 : 0}; }
  static constexpr bool mixed_precision = true;  // as MaxPool2d
  static std::string describe() {
    return std::string(Layout == layout::nhwc ? "AvgPool2d[nhwc]<" : "AvgPool2d<") + std::to_string(Kernel) + (Stride != Kernel ? ", stride " + std::to_string(Stride) : "") +
           (Padding ? ", pad " + std::to_string(Padding) : "") + (CountIncludePad ? ">" : ", exclude pad>");
  }
};

namespace detail {
template <class In>
struct global_pool_accepts {
  static_assert(dependent_false<In>,
                "kiln::nn::GlobalAvgPool: the input must be an image [C, H, W] (global_pool_accepts<sample<...>> "
                "names the sizes)");
  using type = In;
};
template <>
struct global_pool_accepts<any_sample> {
  using type = any_sample;
};
template <index_t C, index_t H, index_t W>
struct global_pool_accepts<sample<C, H, W>> {
  using type = sample<C>;
};
}  // namespace detail

// The mean of every channel's plane: [N, C, H, W] (or [N, H, W, C]) -> [N, C]. GlobalAvgPool is
// the NCHW one; GlobalAvgPoolLayout<layout::nhwc> (what with_layout gives) the channels-last one.
template <layout Layout>
struct GlobalAvgPoolLayout {
  static constexpr layout image_layout = Layout;
  template <layout L>
  using with_layout = GlobalAvgPoolLayout<L>;
  template <class In>
  using output_sample = typename detail::global_pool_accepts<In>::type;

  template <class Exec, class T, class S, index_t B, index_t D1, index_t D2, index_t D3>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<T, S, B, D1, D2, D3>& x) const {
    detail::check_pool_space<Exec, S>();
    constexpr bool nhwc = Layout == layout::nhwc;
    using Out = ag::Var<T, S, B, nhwc ? D3 : D1>;
    const Shape xs = x.shape();
    KILN_CHECK(xs.rank == 4 && xs[1] > 0 && xs[2] > 0 && xs[3] > 0, ShapeError,
               "GlobalAvgPool: the input must be ", nhwc ? "[N, H, W, C]" : "[N, C, H, W]",
               " with non-empty images, got ", xs.str());
    const index_t n = xs[0], c = xs[nhwc ? 3 : 1], h = xs[nhwc ? 1 : 2], w = xs[nhwc ? 2 : 3];
    if (n == 0) return detail::empty_batch_output<Out>(tape, Shape{0, c}, x);
    Out out{typename Out::tensor_type(Shape{n, c})};
    const std::size_t bytes = std::size_t(xs.size() + n * c) * sizeof(T);
    constexpr bool on_host = std::is_same_v<S, host>;
    if constexpr (on_host) {
      tape.exec().stats().count(kind::reduce, "global_avg_pool", n * c, bytes);
      auto kernel = [&](const auto* X, auto* Y) {
        if constexpr (nhwc) cpu::global_avg_pool_nhwc_forward(n, c, h, w, X, Y);
        else cpu::global_avg_pool_forward(n, c, h, w, X, Y);
      };
      if constexpr (kiln::detail::is_half_v<T>) {  // summed in float (nn/half_io.hpp)
        const auto xf = detail::widened(x.value().data(), xs.size(), tape.exec().threads());
        std::vector<float> yf(static_cast<std::size_t>(n * c));
        kernel(xf.data(), yf.data());
        detail::store_rounded(out.value().data(), yf.data(), n * c);
      } else {
        kernel(x.value().data(), out.value().data());
      }
    } else {  // a device: a team per plane
      static_assert(!kiln::detail::is_half_v<T>, "kiln::nn::GlobalAvgPool: bf16 / f16 activations run on the CPU so "
                                                "far (the device's half-precision convnet path is not written yet)");
      detail::launch_lines<false>(tape.exec(), n * c, h * w,
                                  detail::GlobalAvgRows<T>{x.value().data(), out.value().data(), c, h * w, nhwc},
                                  "global_avg_pool", bytes, kind::reduce);
    }
    if (!x.requires_grad() || !tape.recording()) return out;
    out.set_requires_grad(true);
    tape.record(out, {x.data()}, [xd = x.data(), n, c, h, w, bytes](Exec& exec, auto& od) {
      if (!od.grad_valid || !xd->requires_grad) return;
      const T* G = od.grad.data();
      if constexpr (on_host) {
        exec.stats().count(kind::other, "global_avg_pool_backward", xd->value.size(), bytes);
        auto kernel = [&](const auto* dy, auto* dx) {
          if constexpr (nhwc) cpu::global_avg_pool_nhwc_backward(n, c, h, w, dy, dx);
          else cpu::global_avg_pool_backward(n, c, h, w, dy, dx);
        };
        if constexpr (kiln::detail::is_half_v<T>) {
          const auto gf = detail::widened(G, n * c);
          detail::put_rounded_input_grad(*xd, [&](float* dx) { kernel(gf.data(), dx); }, exec.threads());
        } else {
          detail::put_input_grad(*xd, [&](T* dx) { kernel(G, dx); });
        }
      } else {
        const bool add = xd->grad_valid;
        exec.for_each_element(1, xd->value.size(),
                              detail::GlobalAvgBackward<T>{G, xd->ensure_grad(), detail::ImageIndex{c, h * w, nhwc}, add},
                              kind::other, "global_avg_pool_backward", bytes);
        xd->grad_valid = true;
      }
    });
    return out;
  }
  static constexpr Launches launches(const LaunchContext& c) { return {1, c.input_grad ? 1 : 0}; }
  static constexpr bool mixed_precision = true;  // as MaxPool2d
  static std::string describe() { return Layout == layout::nhwc ? "GlobalAvgPool[nhwc]" : "GlobalAvgPool"; }
};
using GlobalAvgPool = GlobalAvgPoolLayout<layout::nchw>;

}  // namespace kiln::nn

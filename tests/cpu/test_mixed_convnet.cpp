// Mixed precision for convnets on the CPU (issue 29): Conv2d, BatchNorm2d, the pools and residual
// sums take bf16 / f16 activations, compute in float on widened values (the convolution with its
// weight's half-precision copy) and round once per store — so a layer's bf16 output is exactly the
// float layer's output on the rounded inputs, rounded. Channels-last bf16 convolutions instead run
// the bf16 GEMM (issue 31): within one rounding of that. A small ResNet trains under bf16_mixed and
// fp16_mixed, tracking the fp32 loss curve, with the launches its type predicts.
#include <kiln/nn/named.hpp>
#include <kiln/train.hpp>

#include <doctest/doctest.h>

#include "step_helpers.hpp"

#include <cmath>
#include <string>
#include <vector>

using namespace kiln;

namespace {

using Tape = ag::Tape<CpuExecutor>;

// Random bf16 images [n, c, h, w] and the same values as floats.
template <index_t C, index_t H, index_t W>
std::pair<ag::Var<bf16, host, dyn, C, H, W>, ag::Var<float, host, dyn, C, H, W>> images(index_t n, std::uint64_t seed) {
  Tensor<bf16, host, dyn, C, H, W> half(Shape{n, C, H, W});
  Tensor<float, host, dyn, C, H, W> wide(Shape{n, C, H, W});
  Generator g(seed);
  for (index_t i = 0; i < half.size(); ++i) {
    half.data()[i] = bf16(g.uniform(-2.f, 2.f));
    wide.data()[i] = float(half.data()[i]);
  }
  return {ag::Var<bf16, host, dyn, C, H, W>(std::move(half), true), ag::Var<float, host, dyn, C, H, W>(std::move(wide), true)};
}

// got (bf16) == round(want (float)), element by element.
template <class A, class B>
void check_rounded(const A& got, const B& want) {
  REQUIRE(got.size() == want.size());
  index_t differ = 0;
  for (index_t i = 0; i < got.size(); ++i) differ += float(got.data()[i]) != float(bf16(want.data()[i])) ? 1 : 0;
  CHECK(differ == 0);
}

// Worst |got - want| over the largest |want|.
template <class G>
double worst_relative(const G* got, const float* want, index_t n) {
  double worst = 0, scale = 0;
  for (index_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(double(float(got[i])) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  CHECK(scale > 0);
  return worst / scale;
}

// Backward of sum(y * r) for a fixed r, so every output element has its own gradient.
template <class Y>
void backward_projected(Tape& tape, const Y& y, std::uint64_t seed) {
  using V = typename Y::value_type;
  Tensor<V, host, dyn, dyn> r(Shape{y.dim(0), y.value().size() / y.dim(0)});
  Generator g(seed);
  for (index_t i = 0; i < r.size(); ++i) r.data()[i] = V(g.uniform(-1.f, 1.f));
  const auto rows = nn::Flatten{}.forward(tape, y);
  tape.backward(ag::sum(tape, ag::map(tape, cast<float>(rows) * cast<float>(r))));
}

}  // namespace

TEST_CASE("mixed precision: a bf16 Conv2d + ReLU is the float convolution of the rounded values, rounded") {
  CpuExecutor exec(1);
  Tape tape(exec);
  nn::Conv2d<3, 5, 3, 2, 1> conv(7);
  conv.refresh_low_copy<bf16>(exec);
  // The float reference reads the weight rounded to bf16, as the half-precision path does.
  nn::Conv2d<3, 5, 3, 2, 1> rounded(7);
  for (index_t i = 0; i < rounded.weight().value().size(); ++i)
    rounded.weight().value().data()[i] = float(bf16(rounded.weight().value().data()[i]));
  auto [xh, xf] = images<3, 9, 11>(4, 3);
  const auto yh = conv.forward_fused<nn::ReLU>(tape, xh);
  const auto yf = rounded.forward_fused<nn::ReLU>(tape, xf);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(yh)>, ag::Var<bf16, host, dyn, 5, 5, 6>>);
  check_rounded(yh.value(), yf.value());
  // Backward: the input's gradient (bf16) and the weight's (float) from the same dy.
  backward_projected(tape, yh, 9);
  const std::vector<float> dw_half(conv.weight().grad().data(), conv.weight().grad().data() + conv.weight().value().size());
  Tape again(exec);
  backward_projected(again, rounded.forward_fused<nn::ReLU>(again, xf), 9);
  // dy rounded to bf16 (the output's gradient is stored in the activation type) is the difference
  // from the float reference: within a few bf16 ulps of the largest gradient.
  const double dx_err = worst_relative(xh.grad().data(), xf.grad().data(), xf.value().size());
  const double dw_err = worst_relative(dw_half.data(), rounded.weight().grad().data(), rounded.weight().value().size());
  MESSAGE("bf16 conv backward, worst error relative to the largest: dx ", dx_err, ", dw ", dw_err);
  CHECK(dx_err <= 1.0 / 128);
  CHECK(dw_err <= 1.0 / 128);
}

namespace {

// A channels-last bf16 Conv2d<Cin, Cout, K, S, P> + ReLU (the bf16 GEMM: AMX / vdpbf16ps / the
// emulation, whichever gemm_bf16_path is current) against the float layer on the same rounded
// values: forward within one bf16 rounding of the float result (the sums differ only in order),
// backward within a few bf16 ulps of the largest gradient; and bit for bit the same at 1 and 2
// threads.
template <index_t Cin, index_t Cout, index_t K, index_t S, index_t P, index_t H, index_t W>
void check_bf16_nhwc_conv(std::uint64_t seed) {
  using Layer = typename nn::Conv2d<Cin, Cout, K, S, P>::template with_layout<nn::layout::nhwc>;
  INFO("Conv2d<" << Cin << ", " << Cout << ", " << K << ", " << S << ", " << P << "> on " << H << "x" << W);
  std::vector<float> first_y, first_dx, first_dw;
  for (int threads : {1, 2}) {
    CpuExecutor exec(threads);
    Tape tape(exec);
    Layer conv(seed), rounded(seed);
    conv.template refresh_low_copy<bf16>(exec);
    for (index_t i = 0; i < rounded.weight().value().size(); ++i)
      rounded.weight().value().data()[i] = float(bf16(rounded.weight().value().data()[i]));
    auto [xh, xf] = images<H, W, Cin>(3, seed + 1);
    const auto yh = conv.template forward_fused<nn::ReLU>(tape, xh);
    const auto yf = rounded.template forward_fused<nn::ReLU>(tape, xf);
    REQUIRE(yh.value().size() == yf.value().size());
    index_t off = 0;
    for (index_t i = 0; i < yf.value().size(); ++i) {
      const float want = yf.value().data()[i], got = float(yh.value().data()[i]);
      // One rounding of a float sum that differs from `want` in its last bits: at most one bf16 ulp.
      off += std::abs(got - want) > std::abs(want) * 0x1p-7f + 1e-6f ? 1 : 0;
    }
    CHECK(off == 0);
    backward_projected(tape, yh, seed + 2);
    Tape again(exec);
    backward_projected(again, rounded.template forward_fused<nn::ReLU>(again, xf), seed + 2);
    const index_t wn = rounded.weight().value().size();
    const double dx_err = worst_relative(xh.grad().data(), xf.grad().data(), xf.value().size());
    const double dw_err = worst_relative(conv.weight().grad().data(), rounded.weight().grad().data(), wn);
    const double db_err = worst_relative(conv.bias().grad().data(), rounded.bias().grad().data(), Cout);
    CHECK(dx_err <= 1.0 / 128);
    CHECK(dw_err <= 1.0 / 128);
    CHECK(db_err <= 1.0 / 128);
    std::vector<float> y(std::size_t(yh.value().size())), dx(std::size_t(xh.value().size()));
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = float(yh.value().data()[i]);
    for (std::size_t i = 0; i < dx.size(); ++i) dx[i] = float(xh.grad().data()[i]);
    const std::vector<float> dw(conv.weight().grad().data(), conv.weight().grad().data() + wn);
    if (threads == 1) {
      first_y = y, first_dx = dx, first_dw = dw;
    } else {
      CHECK(y == first_y);
      CHECK(dx == first_dx);
      CHECK(dw == first_dw);
    }
    // x read by two convolutions: the second backward adds into x's bf16 gradient.
    Tape twice(exec), twice_f(exec);
    auto [xh2, xf2] = images<H, W, Cin>(2, seed + 3);
    auto loss_of = [](Tape& t, const auto& a, const auto& b) {
      const auto fa = nn::Flatten{}.forward(t, a), fb = nn::Flatten{}.forward(t, b);
      return ag::sum(t, ag::map(t, cast<float>(fa) * cast<float>(fb)));
    };
    twice.backward(loss_of(twice, conv.template forward_fused<nn::ReLU>(twice, xh2), conv.forward(twice, xh2)));
    twice_f.backward(
        loss_of(twice_f, rounded.template forward_fused<nn::ReLU>(twice_f, xf2), rounded.forward(twice_f, xf2)));
    CHECK(worst_relative(xh2.grad().data(), xf2.grad().data(), xf2.value().size()) <= 1.0 / 64);
  }
}

}  // namespace

TEST_CASE("mixed precision: a channels-last bf16 Conv2d runs the bf16 GEMM within a rounding of the float layer") {
  const auto path = cpu::current_gemm_bf16_path();
  const std::string name = path == cpu::gemm_bf16_path::amx      ? "amx"
                           : path == cpu::gemm_bf16_path::native ? "vdpbf16ps"
                                                                 : "emulate";
  MESSAGE("bf16 GEMM path: " << name);
  check_bf16_nhwc_conv<16, 24, 3, 1, 1, 10, 9>(11);  // the float layer's Winograd shape
  check_bf16_nhwc_conv<3, 16, 7, 2, 3, 17, 15>(12);  // a stem
  check_bf16_nhwc_conv<40, 33, 1, 1, 0, 7, 6>(13);   // pointwise: x's rows are the column matrix
  check_bf16_nhwc_conv<24, 48, 1, 2, 0, 9, 8>(14);   // a strided downsample
  check_bf16_nhwc_conv<8, 8, 3, 2, 1, 12, 12>(15);
  if (path != cpu::gemm_bf16_path::emulate) {  // the emulation too, where a native kernel is the default
    cpu::set_gemm_bf16_path(cpu::gemm_bf16_path::emulate);
    check_bf16_nhwc_conv<16, 24, 3, 1, 1, 10, 9>(11);
    check_bf16_nhwc_conv<24, 48, 1, 2, 0, 9, 8>(14);
    cpu::set_gemm_bf16_path(path);
  }
}

namespace {

// The epilogue z + b, written so that the convolution may hand the bias to its GEMM (bias_only)
// or not (the float rows through operator(), rounded after).
struct AddBias {
  const float* b;
  bool to_gemm;
  const float* bias_only() const { return to_gemm ? b : nullptr; }
  void operator()(index_t, const float* z, float* out, index_t c) const {
    for (index_t j = 0; j < c; ++j) out[j] = z[j] + b[j];
  }
};

// A channels-last bf16 convolution with a bias, forward, three ways: the bias to the GEMM (on
// AMX the patches packed by the GEMM from x, the bias added as the tiles are rounded), the bias in
// the epilogue pass, and the explicit column matrix (im2col) through gemm_rounded. k is within one
// GEMM block here, so all three are the same float sums plus the bias, rounded: the same bits.
void check_bias_forward_bits(const cpu::Conv2dShape& s, int threads, std::uint64_t seed) {
  INFO("Cin " << s.c_in << " Cout " << s.c_out << " K " << s.kh << " stride " << s.stride_h << " pad " << s.pad_h
              << " on " << s.h << "x" << s.w << ", threads " << threads);
  Generator g(seed);
  const index_t k = s.col_rows(), ohw = s.out_h() * s.out_w();
  std::vector<bf16> x(std::size_t(s.n * s.h * s.w * s.c_in)), w(std::size_t(s.c_out * k));
  std::vector<float> b(std::size_t(s.c_out));
  for (auto& v : x) v = bf16(g.uniform(-2.f, 2.f));
  for (auto& v : w) v = bf16(g.uniform(-1.f, 1.f));
  for (auto& v : b) v = g.uniform(-1.f, 1.f);
  const std::size_t y_size = std::size_t(s.n * ohw * s.c_out);
  std::vector<bf16> fused(y_size), pass(y_size), reference(y_size);
  cpu::conv2d_nhwc_bf16_forward_epilogue(s, x.data(), w.data(), fused.data(), threads, AddBias{b.data(), true});
  cpu::conv2d_nhwc_bf16_forward_epilogue(s, x.data(), w.data(), pass.data(), threads, AddBias{b.data(), false});
  // The reference: im2col of every image, the weight permuted to patch order, one gemm_rounded.
  std::vector<bf16> col(std::size_t(s.n * ohw * k)), wp(w.size());
  for (index_t n = 0; n < s.n; ++n)
    for (index_t oh = 0; oh < s.out_h(); ++oh)
      cpu::detail::im2col_nhwc(s, x.data() + n * s.h * s.w * s.c_in, oh, col.data() + (n * ohw + oh * s.out_w()) * k);
  cpu::detail::conv2d_nhwc_permute<true>(s, w.data(), wp.data());
  cpu::gemm_rounded(cpu::trans::no, cpu::trans::yes, s.n * ohw, s.c_out, k, col.data(), k, wp.data(), k,
                    reference.data(), s.c_out, threads, b.data());
  index_t fused_same = 0, pass_same = 0;
  for (std::size_t i = 0; i < y_size; ++i) {
    fused_same += fused[i].bits == reference[i].bits ? 1 : 0;
    pass_same += pass[i].bits == reference[i].bits ? 1 : 0;
  }
  CHECK(fused_same == index_t(y_size));
  CHECK(pass_same == index_t(y_size));
}

cpu::Conv2dShape conv_shape(index_t n, index_t cin, index_t h, index_t w, index_t cout, index_t kernel, index_t stride,
                            index_t pad) {
  cpu::Conv2dShape s;
  s.n = n, s.c_in = cin, s.h = h, s.w = w, s.c_out = cout, s.kh = s.kw = kernel, s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

}  // namespace

TEST_CASE("mixed precision: a bf16 channels-last convolution's bias goes to the GEMM with the same bits") {
  for (int threads : {1, 2}) {
    check_bias_forward_bits(conv_shape(3, 32, 9, 11, 64, 3, 1, 1), threads, 1);   // k = 288: whole tiles
    check_bias_forward_bits(conv_shape(2, 24, 8, 8, 40, 3, 2, 1), threads, 2);    // k = 216: a zero tail
    check_bias_forward_bits(conv_shape(2, 3, 15, 13, 16, 7, 2, 3), threads, 3);   // a stem, mostly padding
    check_bias_forward_bits(conv_shape(4, 64, 4, 4, 33, 3, 1, 1), threads, 4);    // k = 576, Cout past a tile
    check_bias_forward_bits(conv_shape(70, 8, 6, 6, 8, 3, 1, 1), threads, 5);     // many images: chunks
  }
}

TEST_CASE("mixed precision: bf16 BatchNorm2d, pools and a residual sum are their float selves on rounded values") {
  CpuExecutor exec(2);
  Tape tape(exec);
  auto [xh, xf] = images<4, 6, 6>(3, 5);
  nn::BatchNorm2d<4> bn_half, bn_float;
  check_rounded(bn_half.forward_fused<nn::ReLU>(tape, xh).value(), bn_float.forward_fused<nn::ReLU>(tape, xf).value());
  // The running statistics are float and move the same way.
  for (index_t c = 0; c < 4; ++c)
    CHECK(bn_half.buffers().running_mean.data()[c] == bn_float.buffers().running_mean.data()[c]);
  check_rounded(nn::MaxPool2d<3, 2, 1>{}.forward(tape, xh).value(), nn::MaxPool2d<3, 2, 1>{}.forward(tape, xf).value());
  check_rounded(nn::AvgPool2d<2>{}.forward(tape, xh).value(), nn::AvgPool2d<2>{}.forward(tape, xf).value());
  check_rounded(nn::GlobalAvgPool{}.forward(tape, xh).value(), nn::GlobalAvgPool{}.forward(tape, xf).value());
  using Block = nn::Residual<nn::Sequential<nn::Conv2d<4, 4, 3, 1, 1>>, void, nn::ReLU>;
  static_assert(Block::mixed_precision);
  Block block(2);
  block.refresh_low_copy<bf16>(exec);
  const auto y = block.forward(tape, xh);
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(y)>::value_type, bf16>);
  for (index_t i = 0; i < y.value().size(); ++i) CHECK(float(y.value().data()[i]) >= 0.0f);
}

namespace {

// sum(y * r) with r exactly representable in bf16, so the float layer's output gradient is the
// bf16 layer's, value for value.
template <class Y>
void backward_with_bf16_weights(Tape& tape, const Y& y, std::uint64_t seed) {
  Tensor<float, host, dyn, dyn> r(Shape{y.dim(0), y.value().size() / y.dim(0)});
  Generator g(seed);
  for (index_t i = 0; i < r.size(); ++i) r.data()[i] = float(bf16(g.uniform(-1.f, 1.f)));
  const auto rows = nn::Flatten{}.forward(tape, y);
  tape.backward(ag::sum(tape, ag::map(tape, cast<float>(rows) * r)));
}

template <class A, class B>
void check_same_floats(const A* got, const B* want, index_t n) {
  index_t differ = 0;
  for (index_t i = 0; i < n; ++i) differ += float(got[i]) != float(want[i]) ? 1 : 0;
  CHECK(differ == 0);
}

}  // namespace

TEST_CASE("mixed precision: a channels-last bf16 BatchNorm2d reads and writes bf16 directly, its float self rounded") {
  using BN = nn::BatchNorm2d<40>::with_layout<nn::layout::nhwc>;
  for (int threads : {1, 2})
    for (bool training : {true, false})
      for (bool residual : {false, true}) {
        INFO("threads " << threads << (training ? ", training" : ", eval") << (residual ? ", residual + ReLU" : ", ReLU"));
        CpuExecutor exec(threads);
        Tape tape(exec);
        auto [xh, xf] = images<7, 5, 40>(3, 21);
        auto [rh, rf] = images<7, 5, 40>(3, 22);
        BN bn_half, bn_float;
        for (BN* bn : {&bn_half, &bn_float}) {
          Generator g(23);  // non-trivial gamma, beta and running statistics
          for (index_t c = 0; c < 40; ++c) {
            bn->weight().value().data()[c] = g.uniform(0.5f, 1.5f);
            bn->bias().value().data()[c] = g.uniform(-0.5f, 0.5f);
            bn->buffers().running_mean.data()[c] = g.uniform(-0.3f, 0.3f);
            bn->buffers().running_var.data()[c] = g.uniform(0.5f, 2.0f);
          }
          bn->train(training);
        }
        using YH = ag::Var<bf16, host, dyn, 7, 5, 40>;
        using YF = ag::Var<float, host, dyn, 7, 5, 40>;
        const auto yh = residual ? bn_half.forward_residual<fn::Relu, YH>(tape, xh, rh) : bn_half.forward_fused<nn::ReLU>(tape, xh);
        Tape again(exec);
        const auto yf = residual ? bn_float.forward_residual<fn::Relu, YF>(again, xf, rf) : bn_float.forward_fused<nn::ReLU>(again, xf);
        check_rounded(yh.value(), yf.value());
        for (index_t c = 0; c < 40; ++c)
          CHECK(bn_half.buffers().running_mean.data()[c] == bn_float.buffers().running_mean.data()[c]);
        backward_with_bf16_weights(tape, yh, 24);
        backward_with_bf16_weights(again, yf, 24);
        check_rounded(xh.grad(), xf.grad());
        if (residual) check_rounded(rh.grad(), rf.grad());
        check_same_floats(bn_half.weight().grad().data(), bn_float.weight().grad().data(), 40);
        check_same_floats(bn_half.bias().grad().data(), bn_float.bias().grad().data(), 40);
      }
}

namespace {

using SmallResNet =
    nn::Sequential<nn::Unflatten<3, 8, 8>, nn::Named<"conv1", nn::Conv2d<3, 8, 3, 1, 1, 1, false>>,
                   nn::Named<"bn1", nn::BatchNorm2d<8>>, nn::ReLU, nn::MaxPool2d<2>,
                   nn::Residual<nn::Sequential<nn::Conv2d<8, 8, 3, 1, 1, 1, false>, nn::BatchNorm2d<8>, nn::ReLU,
                                               nn::Conv2d<8, 8, 3, 1, 1, 1, false>, nn::BatchNorm2d<8>>,
                                void, nn::ReLU>,
                   nn::GlobalAvgPool, nn::Named<"fc", nn::Linear<8, 4>>>;

// A learnable problem on 3x8x8 images: the label is the channel-and-half (of four regions) with
// the largest mean.
kiln_step_test::OwnedBatch image_batch(index_t rows, std::uint64_t seed) {
  Generator g(seed);
  kiln_step_test::OwnedBatch b;
  b.dim = 3 * 8 * 8;
  for (index_t r = 0; r < rows; ++r) {
    const auto label = std::int32_t(g.below(4));
    for (index_t c = 0; c < 3; ++c)
      for (index_t p = 0; p < 64; ++p) {
        const bool hot = (label == 3 && c == 0 && p < 32) || (label < 3 && c == label && p >= 32);
        b.x.push_back(g.uniform(-1.f, 1.f) + (hot ? 1.5f : 0.0f));
      }
    b.y.push_back(label);
  }
  return b;
}

template <class Policy>
std::vector<float> resnet_losses(int steps, index_t* launches_measured = nullptr, index_t* launches_predicted = nullptr) {
  CpuExecutor exec(2);
  SmallResNet model(4);
  optim::AdamW opt(model, {.lr = 3e-3});
  train::Step step(model, opt, exec, Policy{}, {}, {.loss_window = 1000});
  for (int s = 0; s < steps; ++s) {
    auto b = image_batch(16, 700 + s);
    const auto before = exec.stats().launches();
    step(b.batch());
    if (s == steps - 1 && launches_measured) {
      *launches_measured = index_t(exec.stats().launches() - before);
      *launches_predicted = step.predicted_launches();
    }
  }
  return step.take_losses();
}

}  // namespace

TEST_CASE("mixed precision: a small ResNet trains under bf16_mixed and fp16_mixed, tracking fp32, launches as predicted") {
  static_assert(SmallResNet::mixed_precision);
  const int steps = 40;
  const auto fp32 = resnet_losses<kiln::policy<>>(steps);
  index_t measured = 0, predicted = 0;
  const auto bf = resnet_losses<kiln::policy<kiln::precision::bf16_mixed>>(steps, &measured, &predicted);
  CHECK(measured == predicted);
  const auto half = resnet_losses<kiln::policy<kiln::precision::fp16_mixed>>(steps, &measured, &predicted);
  CHECK(measured == predicted);
  double worst_bf = 0, worst_half = 0;
  for (int s = 0; s < steps; ++s) {
    const double f = fp32[std::size_t(s)];
    worst_bf = std::max(worst_bf, std::abs(double(bf[std::size_t(s)]) - f) / f);
    worst_half = std::max(worst_half, std::abs(double(half[std::size_t(s)]) - f) / f);
  }
  MESSAGE("worst relative loss difference to fp32: bf16 ", worst_bf, ", fp16 ", worst_half);
  CHECK(worst_bf <= 0.05);
  CHECK(worst_half <= 0.02);
  CHECK(bf.back() < 0.7 * bf.front());
  CHECK(half.back() < 0.7 * half.front());
}

TEST_CASE("mixed precision: channels-last bf16 max pooling reads and writes bf16 directly, its float self rounded") {
  // The forward picks one of the inputs (exact in bf16); the backward reads x and dy as bf16 and
  // sums dx in float, rounded once: the bits of the float layer on the widened tensors.
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    CpuExecutor exec(threads);
    auto check = [&](auto pool, std::uint64_t seed) {
      Tape tape(exec), again(exec);
      auto [xh, xf] = images<9, 11, 24>(3, seed);
      const auto yh = pool.forward(tape, xh);
      const auto yf = pool.forward(again, xf);
      check_rounded(yh.value(), yf.value());
      backward_with_bf16_weights(tape, yh, seed + 1);
      backward_with_bf16_weights(again, yf, seed + 1);
      check_rounded(xh.grad(), xf.grad());
    };
    check(nn::MaxPool2d<3, 2, 1, nn::layout::nhwc>{}, 31);  // overlapping windows: dx sums two
    check(nn::MaxPool2d<2, 2, 0, nn::layout::nhwc>{}, 32);  // ResNet-9's
  }
}

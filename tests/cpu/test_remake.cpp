// Activations freed after forward and made again in backward (kiln/autograd/remake.hpp): a batch
// norm's output fed to a convolution or a max pool inside a Sequential is freed once that layer ran
// forward, and its backward makes it again from the batch norm's input — the same elements bit for
// bit, so every gradient equals the one computed with the activation kept; memory in use after
// forward drops by exactly the freed activations; an activation the caller may still read is kept.
#include <kiln/nn/batchnorm.hpp>
#include <kiln/nn/conv.hpp>
#include <kiln/nn/activation.hpp>
#include <kiln/nn/dropout.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/pool.hpp>
#include <kiln/nn/reshape.hpp>
#include <kiln/nn/sequential.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;

namespace {

constexpr index_t C = 16, H = 32, W = 32, N = 2, Size = C * H * W;

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  Generator gen(seed);
  std::vector<T> v(n);
  for (T& e : v) e = T(gen.uniform(-2.f, 2.f));
  return v;
}

template <class T>
bool same_bits(const T* a, const T* b, index_t n) {
  return std::memcmp(a, b, std::size_t(n) * sizeof(T)) == 0;
}

// The batch norm kernels' apply (what a remade output runs) against the forward that wrote the
// constants: train and eval mode, with and without ReLU, one layout (nn's kernel table for it).
template <nn::layout L, class T, class Act>
void apply_equals_forward(Act act) {
  using K = nn::detail::bn_kernels<L>;
  const index_t c = 24, hw = 7 * 9, n = 3;  // 24 channels: more than one NHWC channel part
  const auto x = random_values<T>(std::size_t(n * c * hw), 1);
  const auto gamma = random_values<T>(std::size_t(c), 3), beta = random_values<T>(std::size_t(c), 4);
  const T* none = nullptr;  // no residual
  for (bool train : {true, false}) {
    CAPTURE(train);
    const std::size_t cs = std::size_t(c);
    std::vector<T> rm(cs, T(0.25)), rv(cs, T(1.5)), mean(cs), invstd(cs), scale(cs, T(-7)), y(x.size()),
        y2(x.size(), T(-9));
    if (train)
      K::train_forward(n, c, hw, x.data(), gamma.data(), beta.data(), 1e-5, 0.1, rm.data(), rv.data(), y.data(),
                       mean.data(), invstd.data(), 2, act, none, scale.data());
    else
      K::eval_forward(n, c, hw, x.data(), gamma.data(), beta.data(), 1e-5, rm.data(), rv.data(), y.data(), 2, act,
                      none, scale.data());
    const T* m = train ? mean.data() : rm.data();
    for (int threads : {1, 2}) {
      K::apply(n, c, hw, x.data(), m, scale.data(), beta.data(), y2.data(), threads, act);
      CHECK(same_bits(y.data(), y2.data(), n * c * hw));
    }
  }
}

// A Sequential run by hand, layer by layer (what Sequential fuses, fused the same way), keeping
// every intermediate alive: the reference without remaking.
template <class Net, class X>
auto by_hand(Net& net, Tape& t, const X& x) {
  auto a = net.template layer<0>().forward(t, x);                             // Unflatten
  auto z1 = net.template layer<1>().forward(t, a);                            // Conv2d
  auto a1 = net.template layer<2>().template forward_fused<nn::ReLU>(t, z1);  // BatchNorm2d + ReLU
  auto z2 = net.template layer<4>().forward(t, a1);                           // Conv2d
  auto a2 = net.template layer<5>().template forward_fused<nn::ReLU>(t, z2);  // BatchNorm2d + ReLU
  auto p = net.template layer<7>().forward(t, a2);                            // MaxPool2d
  auto f = net.template layer<8>().forward(t, p);                             // Flatten
  return std::tuple{net.template layer<9>().forward(t, f), a1, a2};           // Linear
}

template <class Net>
void sequential_case() {
  using T = float;
  Net net(11);
  // Scales and shifts away from 1 and 0 (a remade output that normalised without them would pass).
  for (auto* bn : {&net.template layer<2>(), &net.template layer<5>()}) {
    const auto g = random_values<T>(C, 20), b = random_values<T>(C, 21);
    std::copy(g.begin(), g.end(), bn->weight().value().data());
    std::copy(b.begin(), b.end(), bn->bias().value().data());
  }
  CpuExecutor exec(2);
  ag::Var<T, host, dyn, Size> x(Tensor<T, host, dyn, Size>(Shape{N, Size}), true);
  const auto xv = random_values<T>(std::size_t(N * Size), 12);
  std::copy(xv.begin(), xv.end(), x.value().data());
  static const std::int32_t labels[N] = {3, 1};

  // Gradients of x and of every parameter, and the host memory forward left in use.
  auto run = [&](bool sequential) {
    Tape tape(exec);
    net.zero_grad();
    x.zero_grad();
    const std::size_t before = host_cache_stats().in_use_bytes;  // x's gradient, after the first run
    std::size_t in_use = 0;
    {
      auto logits = [&] {
        if (sequential) return net.forward(tape, x);
        auto [y, a1, a2] = by_hand(net, tape, x);
        return y;  // a1 and a2 die here; their nodes (and values) live on in the steps
      }();
      in_use = host_cache_stats().in_use_bytes - before;
      auto loss = nn::cross_entropy(tape, logits, labels);
      tape.backward(loss);
    }
    std::vector<T> grads(x.grad().data(), x.grad().data() + x.grad().size());
    net.for_each_parameter([&](const auto& p) { grads.insert(grads.end(), p.grad().data(), p.grad().data() + p.grad().size()); });
    return std::pair{grads, in_use};
  };
  const auto [kept, in_use_kept] = run(false);
  const auto [remade, in_use_remade] = run(true);
  REQUIRE(kept.size() == remade.size());
  CHECK(same_bits(kept.data(), remade.data(), index_t(kept.size())));
  // Two activations of N x C x H x W freed: the second conv's input and the pool's.
  CHECK(in_use_kept - in_use_remade == 2 * std::size_t(N * Size) * sizeof(T));
}

}  // namespace

TEST_CASE("batch norm's apply makes its forward's output again, bit for bit") {
  apply_equals_forward<nn::layout::nchw, float>(cpu::NoActivation{});
  apply_equals_forward<nn::layout::nchw, float>(fn::Relu{});
  apply_equals_forward<nn::layout::nhwc, float>(cpu::NoActivation{});
  apply_equals_forward<nn::layout::nhwc, float>(fn::Relu{});
}

using Block = nn::Sequential<nn::Unflatten<C, H, W>, nn::Conv2d<C, C, 3, 1, 1, 1, false>, nn::BatchNorm2d<C>, nn::ReLU,
                             nn::Conv2d<C, C, 1, 1, 0, 1, false>, nn::BatchNorm2d<C>, nn::ReLU, nn::MaxPool2d<3, 2, 1>,
                             nn::Flatten, nn::Linear<C * (H / 2) * (W / 2), 5>>;

TEST_CASE("a batch norm's output feeding a convolution or a pool is freed after forward and made again") {
  SUBCASE("NCHW") { sequential_case<Block>(); }
  SUBCASE("NHWC") { sequential_case<Block::with_layout<nn::layout::nhwc>>(); }
}

TEST_CASE("an activation the caller holds is kept: only what a Sequential made is freed") {
  // A layer that passes its input through (dropout in evaluation) hands the convolution the
  // Sequential's own input, here a batch norm's remakeable output the caller still reads.
  CpuExecutor exec(1);
  Tape tape(exec);
  nn::Sequential<nn::Unflatten<C, H, W>, nn::BatchNorm2d<C>> head(1);
  nn::Sequential<nn::Dropout<0.5>, nn::Conv2d<C, C, 3, 1, 1>> tail(2);
  tail.eval();
  ag::Var<float, host, dyn, Size> x(Tensor<float, host, dyn, Size>(Shape{N, Size}), true);
  const auto xv = random_values<float>(std::size_t(N * Size), 3);
  std::copy(xv.begin(), xv.end(), x.value().data());
  const auto a = head.forward(tape, x);
  REQUIRE(bool(a.data()->remake));
  const auto y = tail.forward(tape, a);
  CHECK(a.value().data() != nullptr);
  CHECK(y.value().data() != nullptr);
}

// nn::dropout and nn::Dropout<P>: the mask is uniform01(seed, offset + i) >= p element by element
// (all four words of each Philox block used, any offset alignment), the 1 / (1 − p) scale, the
// backward g · mask · scale in write and add modes (stored mask and regenerated mask alike), the
// keep rate, p = 0 / p = 1 / eval, one kernel each way, and the layer: P in the type, seeds,
// the offset, train / eval through a Sequential.
#include <kiln.hpp>
#include <kiln/nn/activation.hpp>
#include <kiln/nn/dropout.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/sequential.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;

namespace {

// [rows, cols] values in [1, 2) (never 0: y == 0 means dropped) or [lo, hi).
template <class T = float>
ag::Var<T, host, dyn, dyn> filled(index_t rows, index_t cols, std::uint64_t seed, double lo = 1, double hi = 2,
                                  bool requires_grad = true) {
  HostMatrix<T> m(rows, cols);
  Generator g(seed);
  for (index_t i = 0; i < m.size(); ++i) m.data()[i] = T(g.uniform(float(lo), float(hi)));
  return ag::Var<T, host, dyn, dyn>(std::move(m), requires_grad);
}

template <class T>
bool same_bits(const T* a, const T* b, index_t n) {
  return std::memcmp(a, b, std::size_t(n) * sizeof(T)) == 0;
}

std::size_t launches_named(CpuExecutor& exec, const std::string& name) {
  const auto& r = exec.stats().records();
  return std::size_t(std::count_if(r.begin(), r.end(), [&](const auto& rec) { return rec.name == name; }));
}

const std::uint64_t offsets[] = {0, 1, 2, 3, 5, 8, 1001, (std::uint64_t(1) << 33) + 3};
const index_t sizes[] = {1, 3, 7, 8, 9, 63, 64, 65, 255, 256, 257, 1000, 4099, 64 * 256, 70001};

}  // namespace

TEST_CASE("dropout_threshold: (bits >> 8) >= threshold is exactly uniform01 >= p") {
  const float ps[] = {0.0f, 1e-9f, 0.1f, 0.25f, 0.3f, 0.5f, 0.7f, 0.9f, 1.0f - 1e-7f, 1.0f};
  for (float p : ps) {
    const std::uint32_t t = nn::dropout_threshold(p);
    CHECK(t <= (1u << 24));
    // Around the threshold, where a rounding difference would show.
    for (std::int64_t m = std::int64_t(t) - 3; m <= std::int64_t(t) + 3; ++m) {
      if (m < 0 || m >= (std::int64_t(1) << 24)) continue;
      const std::uint32_t bits = std::uint32_t(m) << 8 | 0x5au;
      INFO("p = " << p << ", m = " << m);
      CHECK(nn::dropout_keeps_bits(bits, t) == (detail::unit_float_open1(bits) >= p));
    }
  }
  CHECK(nn::dropout_threshold(0.0f) == 0);
  CHECK(nn::dropout_threshold(1.0f) == 1u << 24);  // nothing kept
  Generator g(3);
  for (int k = 0; k < 100000; ++k) {
    const std::uint32_t bits = g.next_u32();
    REQUIRE(nn::dropout_keeps_bits(bits, nn::dropout_threshold(0.3f)) == (detail::unit_float_open1(bits) >= 0.3f));
  }
}

TEST_CASE("dropout: the mask is uniform01(seed, offset + i) >= p element by element, scaled by 1 / (1 - p)") {
  CpuExecutor one(1), three(3);  // three threads split the work items at uneven places
  for (CpuExecutor* exec : {&one, &three}) {
    Tape tape(*exec);
    for (index_t n : sizes) {
      auto x = filled(1, n, std::uint64_t(n));
      for (std::uint64_t offset : offsets) {
        for (double p : {0.1, 0.5, 0.9}) {
          const float pf = float(p), scale = float(1.0 / (1.0 - p));
          auto y = nn::dropout(tape, x, p, 42, offset);
          INFO("n = " << n << ", offset = " << offset << ", p = " << p << ", threads = " << exec->threads());
          for (index_t i = 0; i < n; ++i) {
            const bool keep = uniform01(42, offset + std::uint64_t(i)) >= pf;
            REQUIRE(keep == nn::dropout_keeps(42, offset, i, pf));
            const float want = keep ? float(x.value().data()[i] * scale) : 0.0f;
            REQUIRE(y.value().data()[i] == want);  // exactly: one rounded multiply
          }
        }
      }
    }
  }
}

TEST_CASE("dropout: the per-item path (what a GPU runs) and the CPU's tiles give the same bits") {
  for (index_t n : {index_t(1), index_t(9), index_t(300), index_t(4099)}) {
    for (std::uint64_t offset : offsets) {
      auto x = filled(1, n, 7), g = filled(1, n, 8, -2, 2);
      const auto draw = nn::detail::DropoutDraw::make(99, offset, n, 0.3f);
      const index_t items = draw.items();
      const float scale = float(1.0 / 0.7);
      std::vector<float> y_tile(static_cast<std::size_t>(n)), y_item(static_cast<std::size_t>(n));
      std::vector<std::uint8_t> m_tile(static_cast<std::size_t>(items)), m_item(static_cast<std::size_t>(items));
      nn::detail::DropoutForward<float>{draw, x.value().data(), y_tile.data(), m_tile.data(), scale}.run(0, items);
      const nn::detail::DropoutForward<float> item{draw, x.value().data(), y_item.data(), m_item.data(), scale};
      for (index_t j = 0; j < items; ++j) item(0, j);
      INFO("n = " << n << ", offset = " << offset);
      CHECK(same_bits(y_tile.data(), y_item.data(), n));
      CHECK(m_tile == m_item);
      for (index_t j = 0; j < items; ++j) CHECK(m_item[std::size_t(j)] == draw.byte(j));
      // Mask bits: position lead + i; positions that are no element stay 0.
      index_t bits = 0;
      for (index_t j = 0; j < items; ++j) bits += std::popcount(unsigned(m_item[std::size_t(j)]));
      CHECK(bits == std::count_if(y_item.begin(), y_item.end(), [](float v) { return v != 0.0f; }));
      for (int mode = 0; mode < 4; ++mode) {  // {stored mask, regenerated} x {write, add}
        const bool add = mode & 1;
        const std::uint8_t* mask = mode & 2 ? nullptr : m_tile.data();
        std::vector<float> d_tile(std::size_t(n), 0.25f), d_item(std::size_t(n), 0.25f);
        nn::detail::DropoutBackward<float>{draw, d_tile.data(), g.value().data(), mask, scale, add}.run(0, items);
        const nn::detail::DropoutBackward<float> bitem{draw, d_item.data(), g.value().data(), mask, scale, add};
        for (index_t j = 0; j < items; ++j) bitem(0, j);
        INFO("mode " << mode);
        CHECK(same_bits(d_tile.data(), d_item.data(), n));
        for (index_t i = 0; i < n; ++i) {
          const bool keep = nn::dropout_keeps(99, offset, i, 0.3f);
          const float v = keep ? float(g.value().data()[i] * scale) : 0.0f;
          REQUIRE(d_tile[std::size_t(i)] == (add ? 0.25f + v : v));
        }
      }
    }
  }
}

TEST_CASE("dropout backward: g * mask * scale, written by the first contribution and added by the next") {
  CpuExecutor exec;
  Tape tape(exec);
  for (std::uint64_t offset : {std::uint64_t(0), std::uint64_t(3), std::uint64_t(1001)}) {
    const index_t rows = 37, cols = 129;
    auto x = filled(rows, cols, 11);
    auto w1 = filled(rows, cols, 12, -1, 1, false), w2 = filled(rows, cols, 13, -1, 1, false);
    const double p = 0.3;
    const float scale = float(1.0 / (1.0 - p));
    // x feeds two dropouts: one backward writes x's gradient, the other adds to it.
    auto a = nn::dropout(tape, x, p, 5, offset);
    auto b = nn::dropout(tape, x, p, 6, offset);
    tape.backward(ag::sum(tape, ag::map(tape, a * w1 + b * w2)));
    INFO("offset = " << offset);
    for (index_t i = 0; i < x.value().size(); ++i) {
      const float ga = nn::dropout_keeps(5, offset, i, float(p)) ? float(w1.value().data()[i] * scale) : 0.0f;
      const float gb = nn::dropout_keeps(6, offset, i, float(p)) ? float(w2.value().data()[i] * scale) : 0.0f;
      REQUIRE(x.grad().data()[i] == doctest::Approx(ga + gb).epsilon(1e-6));
      REQUIRE((x.grad().data()[i] == 0.0f) == (ga == 0.0f && gb == 0.0f));
    }
    x.data()->grad_valid = false;
  }
}

TEST_CASE("dropout: double values take the same mask") {
  CpuExecutor exec;
  Tape tape(exec);
  auto x = filled<double>(3, 333, 21);
  auto y = nn::dropout(tape, x, 0.25, 8, 2);
  tape.backward(ag::sum(tape, y));
  for (index_t i = 0; i < x.value().size(); ++i) {
    const bool keep = nn::dropout_keeps(8, 2, i, 0.25f);
    REQUIRE(y.value().data()[i] == (keep ? x.value().data()[i] * (1.0 / 0.75) : 0.0));
    REQUIRE(x.grad().data()[i] == (keep ? 1.0 / 0.75 : 0.0));
  }
}

TEST_CASE("dropout: the keep rate is within 0.5% of 1 - p") {
  CpuExecutor exec;
  Tape tape(exec);
  const index_t n = index_t(1) << 22;
  HostMatrix<float> ones(1024, n / 1024);
  std::fill(ones.data(), ones.data() + n, 1.0f);
  ag::Var<float, host, dyn, dyn> x(std::move(ones), false);
  for (double p : {0.1, 0.5, 0.75}) {
    auto y = nn::dropout(tape, x, p, 2024, 3);
    const auto kept = std::count_if(y.value().data(), y.value().data() + n, [](float v) { return v != 0.0f; });
    const double rate = double(kept) / double(n);
    INFO("p = " << p << ", keep rate " << rate);
    CHECK(std::abs(rate - (1 - p)) <= 0.005 * (1 - p));
  }
}

TEST_CASE("dropout: p = 0 and eval are x itself (no kernel), p = 1 gives zeros and zero gradients") {
  CpuExecutor exec;
  Tape tape(exec);
  auto x = filled(16, 33, 31);
  const auto before = exec.stats().launches();
  CHECK(nn::dropout(tape, x, 0.0, 1, 0).data() == x.data());
  CHECK(nn::dropout(tape, x, 0.5, 1, 0, false).data() == x.data());
  CHECK(exec.stats().launches() == before);

  auto y = nn::dropout(tape, x, 1.0, 1, 3);
  CHECK(std::all_of(y.value().data(), y.value().data() + y.value().size(), [](float v) { return v == 0.0f; }));
  tape.backward(ag::sum(tape, y));
  CHECK(std::all_of(x.grad().data(), x.grad().data() + x.value().size(), [](float v) { return v == 0.0f; }));

  CHECK_THROWS_AS(nn::dropout(tape, x, 1.5, 0, 0), ValueError);
  CHECK_THROWS_AS(nn::dropout(tape, x, -0.1, 0, 0), ValueError);
}

TEST_CASE("dropout: one kernel forward and one kernel backward; the mask only when a gradient is needed") {
  CpuExecutor exec;
  exec.stats().set_recording(true);
  Tape tape(exec);
  auto x = filled(64, 256, 41);
  auto y = nn::dropout(tape, x, 0.1, 1, 0);
  CHECK(launches_named(exec, "dropout") == 1);
  tape.backward(ag::sum(tape, y));
  CHECK(launches_named(exec, "dropout") == 1);
  CHECK(launches_named(exec, "dropout_backward") == 1);
  // The forward's bytes count the stored mask (n / 8) when a gradient is needed, not otherwise.
  const auto& r = exec.stats().records();
  const auto fwd = std::find_if(r.begin(), r.end(), [](const auto& rec) { return rec.name == "dropout"; });
  CHECK(fwd->bytes == std::size_t(64 * 256) * 8 + 64 * 256 / 8);
  CHECK(fwd->elements == 64 * 256);
  {
    ag::NoGrad no_grad;
    auto z = nn::dropout(tape, x, 0.1, 1, 0);
    CHECK(r.back().bytes == std::size_t(64 * 256) * 8);
    CHECK(same_bits(z.value().data(), y.value().data(), 64 * 256));
  }
}

TEST_CASE("dropout: mask from Philox, scaling, same seed same mask, eval identity") {
  CpuExecutor exec;
  Tape tape(exec);
  auto x = filled(64, 64, 10, 1, 2);
  const double p = 0.25;
  auto y = nn::dropout(tape, x, p, 42, 1000);
  index_t kept = 0;
  for (index_t i = 0; i < x.value().size(); ++i) {
    const bool keep = uniform01(42, 1000 + std::uint64_t(i)) >= float(p);
    const float want = keep ? x.value().data()[i] / float(1 - p) : 0.0f;
    REQUIRE(y.value().data()[i] == doctest::Approx(want).epsilon(1e-6));
    kept += keep;
  }
  CHECK(double(kept) / double(x.value().size()) == doctest::Approx(1 - p).epsilon(0.05));
  auto y2 = nn::dropout(tape, x, p, 42, 1000);
  CHECK(std::equal(y.value().data(), y.value().data() + y.value().size(), y2.value().data()));
  auto y3 = nn::dropout(tape, x, 1.0, 42, 1000);
  CHECK(std::all_of(y3.value().data(), y3.value().data() + y3.value().size(), [](float v) { return v == 0.0f; }));

  nn::Dropout<0.5> layer(7);
  auto a = layer.forward(tape, x);
  auto b = layer.forward(tape, x);  // the offset advanced: a different mask
  CHECK_FALSE(std::equal(a.value().data(), a.value().data() + a.value().size(), b.value().data()));
  CHECK(layer.offset() == 2 * 64 * 64);
  layer.eval();
  CHECK(layer.forward(tape, x).data() == x.data());
}

TEST_CASE("Dropout<P>: P in the type, PyTorch's 0.5 when nothing is said, set_p at run time, seeds") {
  static_assert(nn::Dropout<>::declared_p == 0.5);
  static_assert(nn::Dropout<0.1>::declared_p == 0.1);
  static_assert(!std::is_same_v<nn::Dropout<0.1>, nn::Dropout<0.2>>);
  static_assert(std::is_constructible_v<nn::Dropout<0.1>, Generator&>);
  static_assert(!std::is_convertible_v<std::uint64_t, nn::Dropout<>>);  // explicit
  nn::Dropout<> d;
  CHECK(d.p() == 0.5);
  CHECK(d.seed() == 0);
  CHECK(d.training());
  CHECK(d.describe() == "Dropout<0.5>");
  nn::Dropout<0.1> e(99);
  CHECK(e.p() == 0.1);
  CHECK(e.seed() == 99);
  e.set_p(0.3);
  CHECK(e.p() == 0.3);
  CHECK(e.describe() == "Dropout<0.1>, p = 0.3");
  CHECK_THROWS_AS(e.set_p(1.5), ValueError);
  CHECK(e.p() == 0.3);
  Generator g(5), h(5);
  nn::Dropout<0.2> f(g);
  CHECK(f.seed() == h.next_u64());

  // The layer draws at its offset with its runtime p.
  CpuExecutor exec;
  Tape tape(exec);
  auto x = filled(8, 100, 51);
  auto y = e.forward(tape, x);
  for (index_t i = 0; i < x.value().size(); ++i)
    REQUIRE((y.value().data()[i] != 0.0f) == nn::dropout_keeps(99, 0, i, 0.3f));
  CHECK(e.offset() == 800);
  e.train(false);
  CHECK_FALSE(e.training());
  e.train();
  CHECK(e.training());
}

TEST_CASE("Dropout<0.1> in a Sequential: its p, its seed from the model's generator, train / eval") {
  using Model = nn::Sequential<nn::Linear<16, 32>, nn::GELU, nn::Dropout<0.1>, nn::Linear<32, 26>>;
  Model model(3);
  CHECK(model.layer<2>().p() == 0.1);
  CHECK(model.layer<2>().training());
  CpuExecutor exec;
  exec.stats().set_recording(true);
  Tape tape(exec);
  auto x = filled(64, 16, 61, -1, 1);
  (void)model.forward(tape, x);
  CHECK(launches_named(exec, "dropout") == 1);
  CHECK(model.layer<2>().offset() == 64 * 32);
  model.eval();
  CHECK_FALSE(model.layer<2>().training());
  (void)model.forward(tape, x);
  CHECK(launches_named(exec, "dropout") == 1);  // eval: no dropout kernel
  CHECK(model.layer<2>().offset() == 64 * 32);
  model.train();
  CHECK(model.layer<2>().training());

  // Two models from the same seed draw the same dropout seed; layer values pass through.
  Model same(3);
  CHECK(same.layer<2>().seed() == model.layer<2>().seed());
  nn::Sequential<nn::Linear<12, 5>, nn::Dropout<0.2>, nn::Sigmoid> seq(nn::Linear<12, 5>(3), nn::Dropout<0.2>(99),
                                                                       nn::Sigmoid{});
  CHECK(seq.layer<1>().p() == 0.2);
  CHECK(seq.layer<1>().seed() == 99);
}

// The CUDA executor against the CPU executor (the reference backend): the same expressions,
// reductions, GEMMs and autograd graphs run on host copies of the same inputs, and the results
// must agree. Elementwise sizes and offsets are chosen so that both the 16-byte packet kernel
// (aligned, flat operands) and the scalar kernels (views one element off, strided or broadcast
// operands) run, with a tail (n % V != 0) in the packet case; which one ran is checked through
// CudaExecutor::packet_lanes.
//
// Tolerances: device code contracts a * b + c into one FMA and CUDA's expf / tanhf / erff / powf
// are within a few ulps where glibc is within one, so float results may differ by a few ulps,
// plus an absolute part for results near zero after cancellation: 1e-5 * (1 + |ref|). Sums over
// inputs that are multiples of 1/4 in [-1, 1] are exact on both backends (every partial sum is
// a multiple of 1/16 below 2^20), so those reductions must agree bit for bit; continuous
// inputs get a tolerance relative to the sum of magnitudes. GEMMs of small integers are exact.
//
// Inputs are random with a fresh seed per run; the seed is printed with every failure. Set
// KILN_TEST_SEED=<n> to replay a failing run.
#include <doctest/doctest.h>

#include <kiln/cuda.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "support.hpp"

namespace {

using kiln_cuda_test::to_space;
using kiln::dyn;
using kiln::host;
using kiln::index_t;
using kiln::reduce_over;
using Cpu = kiln::CpuExecutor;
using Gpu = kiln::CudaExecutor;
using Device = kiln::cuda;  // spelled out: a bare `cuda` is ambiguous with libcu++'s namespace

template <class T>
using HVec = kiln::Tensor<T, host, dyn>;
template <class T>
using HMat = kiln::Tensor<T, host, dyn, dyn>;
template <class T>
using DVec = kiln::Tensor<T, Device, dyn>;
template <class T>
using DMat = kiln::Tensor<T, Device, dyn, dyn>;

std::uint32_t test_seed() {
  if (const char* s = std::getenv("KILN_TEST_SEED")) return std::uint32_t(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

// Uniform in [lo, hi]; with avoid_zero, values within 0.25 of zero move out to +-0.25; with
// step > 0, values are rounded to multiples of step (exact sums, ties for argmax).
struct Domain {
  double lo = -3, hi = 3;
  bool avoid_zero = false;
  double step = 0;
};

template <class T>
void fill(T* p, index_t n, const Domain& d, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(d.lo, d.hi);
  for (index_t i = 0; i < n; ++i) {
    double v = u(rng);
    if (d.step > 0) v = std::round(v / d.step) * d.step;
    if (d.avoid_zero && std::abs(v) < 0.25) v = v < 0 ? -0.25 : 0.25;
    p[i] = T(v);
  }
}
template <class Tn>
void fill(Tn& t, const Domain& d, std::mt19937& rng) {
  fill(t.data(), t.size(), d, rng);
}

template <class T>
double to_double(T x) {
  if constexpr (kiln::detail::is_half_v<T>) return double(float(x));
  else return double(x);
}

// A tensor's elements in fp64, row-major. The device overload waits for the executor's stream
// first (to_host's cudaMemcpy alone would wait for the legacy default stream only).
template <class T, index_t... D>
std::vector<double> host_values(const kiln::Tensor<T, host, D...>& t) {
  std::vector<double> out(std::size_t(t.size()));
  for (index_t i = 0; i < t.size(); ++i) out[std::size_t(i)] = to_double(t.data()[i]);
  return out;
}
template <class T, index_t... D>
std::vector<double> fetch(Cpu&, const kiln::Tensor<T, host, D...>& t) {
  return host_values(t);
}
template <class T, index_t... D>
std::vector<double> fetch(Gpu& gpu, const kiln::Tensor<T, Device, D...>& t) {
  gpu.synchronize();
  KILN_CUDA_CHECK(cudaGetLastError());
  return host_values(kiln::to_host(t));
}

// A tensor of `shape` in space S with every element set to v (a sentinel for outputs).
template <class S, class T, index_t... D>
kiln::Tensor<T, S, D...> filled(const kiln::Shape& shape, T v) {
  kiln::Tensor<T, host, D...> h(shape);
  for (index_t i = 0; i < h.size(); ++i) h.data()[i] = v;
  return to_space<S>(h);
}

// |got - ref| <= tol * (scale + |ref|): relative, plus an absolute part for results that
// cancelled to near zero; `scale` bounds the magnitudes a result was summed from.
bool close(double got, double ref, double tol, double scale) {
  if (std::isnan(ref)) return std::isnan(got);
  if (std::isinf(ref)) return got == ref;
  return std::abs(got - ref) <= tol * (scale + std::abs(ref));
}

// One CHECK for a whole vector, naming the first mismatch.
void check_close(const std::vector<double>& got, const std::vector<double>& ref, double tol, double scale = 1.0) {
  REQUIRE(got.size() == ref.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!close(got[i], ref[i], tol, scale)) {
      if (bad == 0) first = i;
      ++bad;
    }
  if (bad) {
    INFO(bad << " of " << got.size() << " differ; first at " << first << ": cuda " << got[first] << ", cpu "
              << ref[first] << " (tolerance " << tol << ", scale " << scale << ")");
    CHECK(bad == 0);
  }
}

// The packet lanes the CUDA executor picks for assigning expression e into dst.
template <class Dst, class E>
int lanes_of(const Dst& dst, const E& e) {
  return Gpu::packet_lanes(dst, kiln::Evaluator<E>(e, dst.shape()));
}

// Elements [off, off + n) of a vector: off = 1 moves the view 4 bytes (floats) or 2 bytes
// (halves) off the allocation's 256-byte alignment.
template <class T, class S>
auto part(kiln::Tensor<T, S, dyn>& t, index_t off, index_t n) {
  return kiln::rows(t.view(), off, off + n);
}

constexpr double ftol = 1e-5;
constexpr index_t big = 1000003;  // odd: a tail after the last packet of 4 and of 8

}  // namespace

// ---- elementwise -----------------------------------------------------------------------------

TEST_CASE("CudaExecutor: the 5-op chain on aligned and misaligned operands matches the CPU") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  const float sentinel = 12345.0f;
  for (index_t n : {index_t(0), index_t(1), index_t(7), index_t(31), big}) {
    INFO("n = " << n);
    // One spare element each, so a view can start one element in.
    HVec<float> hx(n + 1), ha(n + 1), hb(n + 1), hy(n);
    fill(hx, {}, rng);
    fill(ha, {}, rng);
    fill(hb, {}, rng);
    auto dx = kiln::to_device(hx), da = kiln::to_device(ha), db = kiln::to_device(hb);
    // Offsets of (x, a and b, destination).
    for (auto [ox, oa, oy] : {std::tuple<index_t, index_t, index_t>{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {0, 0, 1},
                              {1, 1, 1}}) {
      INFO("offsets x " << ox << ", a/b " << oa << ", destination " << oy);
      const bool aligned = ox == 0 && oa == 0 && oy == 0;
      auto scalars = [](const auto& x) { return kiln::maximum(x * 1.5f + -0.25f, 0) * 3.0f - 0.5f; };
      auto tensors = [](const auto& x, const auto& a, const auto& b) { return kiln::maximum(x * a + b, 0) * 3.0f - a; };
      {
        auto dstore = filled<Device, float, dyn>(kiln::Shape{n + 1}, sentinel);
        const auto e = scalars(part(dx, ox, n));
        CHECK(lanes_of(part(dstore, oy, n), e) == (ox == 0 && oy == 0 ? 4 : 0));
        kiln::assign(part(dstore, oy, n), e, gpu);
        kiln::assign(hy, scalars(part(hx, ox, n)), cpu);
        const std::vector<double> got = fetch(gpu, dstore);
        check_close(std::vector<double>(got.begin() + oy, got.begin() + oy + n), fetch(cpu, hy), ftol);
        CHECK(got[std::size_t(oy == 0 ? n : 0)] == sentinel);  // the element outside the view
      }
      {
        auto dstore = filled<Device, float, dyn>(kiln::Shape{n + 1}, sentinel);
        const auto e = tensors(part(dx, ox, n), part(da, oa, n), part(db, oa, n));
        CHECK(lanes_of(part(dstore, oy, n), e) == (aligned ? 4 : 0));
        kiln::assign(part(dstore, oy, n), e, gpu);
        kiln::assign(hy, tensors(part(hx, ox, n), part(ha, oa, n), part(hb, oa, n)), cpu);
        const std::vector<double> got = fetch(gpu, dstore);
        check_close(std::vector<double>(got.begin() + oy, got.begin() + oy + n), fetch(cpu, hy), ftol);
        CHECK(got[std::size_t(oy == 0 ? n : 0)] == sentinel);
      }
    }
    // In place through the packet kernel: each packet is read before it is written.
    auto dz = kiln::to_device(hx);
    HVec<float> hz = kiln::clone(hx);
    kiln::assign(dz, dz * 2.0f + da, gpu);
    kiln::assign(hz, hz * 2.0f + ha, cpu);
    check_close(fetch(gpu, dz), fetch(cpu, hz), ftol);
  }
}

namespace {

// make(x) on the CPU and on the device, aligned and one element off, small and big.
template <class Make>
void check_unary(const char* name, const Domain& d, Make make, std::mt19937& rng, Cpu& cpu, Gpu& gpu) {
  INFO("op = " << name);
  for (auto [n, off] : {std::pair<index_t, index_t>{7, 0}, {31, 1}, {big, 0}, {big, 1}}) {
    INFO("n = " << n << ", offset = " << off);
    HVec<float> hx(n + 1), hy(n);
    fill(hx, d, rng);
    auto dx = kiln::to_device(hx);
    DVec<float> dy(n);
    CHECK(lanes_of(dy.view(), make(part(dx, off, n))) == (off == 0 ? 4 : 0));
    kiln::assign(dy, make(part(dx, off, n)), gpu);
    kiln::assign(hy, make(part(hx, off, n)), cpu);
    check_close(fetch(gpu, dy), fetch(cpu, hy), ftol);
  }
}

template <class Make>
void check_binary(const char* name, const Domain& da, const Domain& db, Make make, std::mt19937& rng, Cpu& cpu,
                  Gpu& gpu) {
  INFO("op = " << name);
  for (auto [n, off] : {std::pair<index_t, index_t>{7, 0}, {31, 1}, {big, 0}, {big, 1}}) {
    INFO("n = " << n << ", offset of b = " << off);
    HVec<float> ha(n), hb(n + 1), hy(n);
    fill(ha, da, rng);
    fill(hb, db, rng);
    auto dA = kiln::to_device(ha), dB = kiln::to_device(hb);
    DVec<float> dy(n);
    kiln::assign(dy, make(dA.view(), part(dB, off, n)), gpu);
    kiln::assign(hy, make(ha.view(), part(hb, off, n)), cpu);
    check_close(fetch(gpu, dy), fetch(cpu, hy), ftol);
  }
}

}  // namespace

TEST_CASE("CudaExecutor: transcendental and other unary ops match the CPU") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  const Domain any{-3, 3}, pos{0.1, 10}, wide{-15, 15}, six{-6, 6};
  check_unary("exp", {-8, 8}, [](const auto& x) { return kiln::exp(x); }, rng, cpu, gpu);
  check_unary("log", pos, [](const auto& x) { return kiln::log(x); }, rng, cpu, gpu);
  check_unary("log1p", {-0.9, 5}, [](const auto& x) { return kiln::log1p(x); }, rng, cpu, gpu);
  check_unary("sqrt", pos, [](const auto& x) { return kiln::sqrt(x); }, rng, cpu, gpu);
  check_unary("rsqrt", pos, [](const auto& x) { return kiln::rsqrt(x); }, rng, cpu, gpu);
  check_unary("reciprocal", {-4, 4, true}, [](const auto& x) { return kiln::reciprocal(x); }, rng, cpu, gpu);
  check_unary("sin", six, [](const auto& x) { return kiln::sin(x); }, rng, cpu, gpu);
  check_unary("cos", six, [](const auto& x) { return kiln::cos(x); }, rng, cpu, gpu);
  check_unary("tanh", six, [](const auto& x) { return kiln::tanh(x); }, rng, cpu, gpu);
  check_unary("sigmoid", wide, [](const auto& x) { return kiln::sigmoid(x); }, rng, cpu, gpu);
  check_unary("gelu", six, [](const auto& x) { return kiln::gelu(x); }, rng, cpu, gpu);
  check_unary("gelu_tanh", six, [](const auto& x) { return kiln::gelu_tanh(x); }, rng, cpu, gpu);
  check_unary("silu", wide, [](const auto& x) { return kiln::silu(x); }, rng, cpu, gpu);
  check_unary("softplus", wide, [](const auto& x) { return kiln::softplus(x); }, rng, cpu, gpu);
  check_unary("abs, neg, square", any, [](const auto& x) { return -kiln::abs(x) + kiln::square(x); }, rng, cpu, gpu);
  check_unary("pow(x, 2.5)", {0, 4}, [](const auto& x) { return kiln::pow(x, 2.5); }, rng, cpu, gpu);
  check_unary("clamp, leaky_relu", any, [](const auto& x) { return kiln::leaky_relu(kiln::clamp(x, -0.5, 0.75), 0.2); },
              rng, cpu, gpu);
  // A chain of transcendentals in one kernel.
  check_unary("exp(tanh(x)) * log1p(x * x)", any,
              [](const auto& x) { return kiln::exp(kiln::tanh(x)) * kiln::log1p(x * x); }, rng, cpu, gpu);
  check_binary("div", any, {-4, 4, true}, [](const auto& a, const auto& b) { return a / b; }, rng, cpu, gpu);
  check_binary("pow", {0.1, 4}, {-2, 2}, [](const auto& a, const auto& b) { return kiln::pow(a, b); }, rng, cpu, gpu);
  check_binary("where(a > b, exp(a), log1p(|b|)) - minimum(a, b)", any, any,
               [](const auto& a, const auto& b) {
                 return kiln::where(kiln::gt(a, b), kiln::exp(a), kiln::log1p(kiln::abs(b))) - kiln::minimum(a, b);
               },
               rng, cpu, gpu);
}

TEST_CASE("CudaExecutor: broadcasting a scalar, a row over rows and a column over columns") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  for (auto [R, C] : {std::pair<index_t, index_t>{5, 7}, {1, 1}, {300, 257}, {1, 100003}, {0, 4}, {3, 0}}) {
    INFO("shape = [" << R << ", " << C << "]");
    HMat<float> hx(R, C), hcol(R, 1), hrow1(1, C), hy(R, C);
    HVec<float> hrow(C);
    fill(hx, {}, rng);
    fill(hcol, {}, rng);
    fill(hrow1, {}, rng);
    fill(hrow, {}, rng);
    auto dx = kiln::to_device(hx), dcol = kiln::to_device(hcol), drow1 = kiln::to_device(hrow1);
    auto drow = kiln::to_device(hrow);
    DMat<float> dy(R, C);
    auto run = [&](auto make) {
      kiln::assign(dy, make(dx, drow, dcol, drow1), gpu);
      kiln::assign(hy, make(hx, hrow, hcol, hrow1), cpu);
      check_close(fetch(gpu, dy), fetch(cpu, hy), ftol);
    };
    run([](const auto& x, const auto& row, const auto&, const auto&) { return x * 2.0f + row; });
    run([](const auto& x, const auto&, const auto& col, const auto&) { return x - col; });
    run([](const auto& x, const auto&, const auto& col, const auto& row1) { return row1 * x + col; });
    run([](const auto&, const auto& row, const auto& col, const auto&) { return row + col; });  // an outer sum
    run([](const auto& x, const auto&, const auto&, const auto&) { return kiln::exp(x) * 0.5f; });
    // A scalar to every element; a row copied to every row.
    kiln::assign(dy, 3, gpu);
    kiln::assign(hy, 3, cpu);
    check_close(fetch(gpu, dy), fetch(cpu, hy), 0);
    kiln::assign(dy, drow, gpu);
    kiln::assign(hy, hrow, cpu);
    check_close(fetch(gpu, dy), fetch(cpu, hy), 0);
    // A broadcast row is not flat: the scalar 2-D kernel runs (unless the row is the whole matrix).
    const bool row_is_whole = hrow.size() == hx.size();
    CHECK(lanes_of(dy.view(), kiln::as_expr(dx) * 2.0f + kiln::as_expr(drow)) == (row_is_whole ? 4 : 0));
  }
}

TEST_CASE("CudaExecutor: transposed and column views as operands and destinations") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  for (auto [R, C] : {std::pair<index_t, index_t>{5, 7}, {1, 9}, {600, 300}}) {
    INFO("shape = [" << R << ", " << C << "]");
    HMat<float> ha(C, R), hb(R, C), hwide(R, C + 5), hy(R, C);
    fill(ha, {}, rng);
    fill(hb, {}, rng);
    fill(hwide, {}, rng);
    auto da = kiln::to_device(ha), db = kiln::to_device(hb), dwide = kiln::to_device(hwide);
    DMat<float> dy(R, C);
    auto run = [&](auto make) {
      kiln::assign(dy, make(da, db, dwide), gpu);
      kiln::assign(hy, make(ha, hb, hwide), cpu);
      check_close(fetch(gpu, dy), fetch(cpu, hy), ftol);
    };
    run([](auto& a, auto& b, auto&) { return kiln::transpose(a.view()) * 2.0f + b; });
    run([](auto& a, auto&, auto&) { return kiln::exp(kiln::transpose(a.view())); });
    run([C](auto& a, auto&, auto& wide) { return kiln::columns(wide.view(), 2, 2 + C) - kiln::transpose(a.view()); });
    const auto t = kiln::as_expr(kiln::transpose(da.view()));
    CHECK(lanes_of(dy.view(), t * 2.0f) == (R == 1 || C == 1 ? 4 : 0));
    // A transposed destination: yt^T = 2b + 1, and columns [1, 4) of a wider matrix.
    HMat<float> hyt(C, R);
    auto dyt = filled<Device, float, dyn, dyn>(kiln::Shape{C, R}, 0.0f);
    for (index_t i = 0; i < hyt.size(); ++i) hyt.data()[i] = 0.0f;
    kiln::assign(kiln::transpose(dyt.view()), db * 2.0f + 1.0f, gpu);
    kiln::assign(kiln::transpose(hyt.view()), hb * 2.0f + 1.0f, cpu);
    check_close(fetch(gpu, dyt), fetch(cpu, hyt), ftol);
    if (C >= 4) {
      kiln::assign(kiln::columns(dwide.view(), 1, 4), kiln::tanh(kiln::columns(db.view(), 0, 3)), gpu);
      kiln::assign(kiln::columns(hwide.view(), 1, 4), kiln::tanh(kiln::columns(hb.view(), 0, 3)), cpu);
      check_close(fetch(gpu, dwide), fetch(cpu, hwide), ftol);
    }
  }
}

TEST_CASE("CudaExecutor: fused is one launch, force_eager five; both match the CPU") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  for (index_t n : {index_t(0), index_t(31), index_t(100003), big}) {
    INFO("n = " << n);
    HVec<float> hx(n), href(n);
    fill(hx, {}, rng);
    auto dx = kiln::to_device(hx);
    DVec<float> fused(n), eager(n);
    auto chain = [](const auto& x) { return kiln::maximum(x * 1.5f + -0.25f, 0) * 3.0f - 0.5f; };

    gpu.stats().reset();
    gpu.stats().set_recording(true);
    kiln::assign(fused, chain(dx), gpu);
    CHECK(gpu.stats().launches() == 1);
    CHECK(gpu.stats().launches(kiln::kind::elementwise) == 1);
    REQUIRE(gpu.stats().records().size() == 1);
    CHECK(gpu.stats().records()[0].name == "fused[mul,add,max,mul,sub]");
    CHECK(gpu.stats().records()[0].elements == n);

    gpu.stats().reset();
    kiln::assign<kiln::stance::force_eager>(eager, chain(dx), gpu);
    CHECK(gpu.stats().launches() == 5);
    const std::vector<std::string> names{"fused[mul]", "fused[add]", "fused[max]", "fused[mul]", "fused[sub]"};
    REQUIRE(gpu.stats().records().size() == names.size());
    for (std::size_t i = 0; i < names.size(); ++i) CHECK(gpu.stats().records()[i].name == names[i]);
    gpu.stats().set_recording(false);

    kiln::assign(href, chain(hx), cpu);
    const std::vector<double> ref = fetch(cpu, href);
    check_close(fetch(gpu, fused), ref, ftol);  // FMA contraction: fused may differ from eager by an ulp
    check_close(fetch(gpu, eager), ref, ftol);
  }
}

TEST_CASE("CudaExecutor: f16 and bf16 storage tensors, packet and scalar kernels, match the CPU") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  using kiln::bf16;
  using kiln::f16;
  for (index_t n : {index_t(0), index_t(1), index_t(7), index_t(31), big}) {
    for (index_t off : {index_t(0), index_t(1)}) {
      INFO("n = " << n << ", offset = " << off);
      HVec<float> hx(n + 1), hy(n);
      fill(hx, {-1000, 1000, true}, rng);  // f16's normal range, far from its overflow
      auto dx = kiln::to_device(hx);
      // float -> f16 (rounding: the same bits on both), into a destination `off` halves in.
      HVec<f16> hh(n);
      auto dhstore = filled<Device, f16, dyn>(kiln::Shape{n + 1}, f16(0.0f));
      const auto to_half = kiln::cast<f16>(part(dx, off, n));
      CHECK(lanes_of(part(dhstore, off, n), to_half) == (off == 0 ? 8 : 0));
      kiln::assign(part(dhstore, off, n), to_half, gpu);
      kiln::assign(hh, kiln::cast<f16>(part(hx, off, n)), cpu);
      const std::vector<double> got = fetch(gpu, dhstore);
      check_close(std::vector<double>(got.begin() + off, got.begin() + off + n), fetch(cpu, hh), 0);
      // f16 operands compute in float: h * 2 + 1 is exact in float, so again bit for bit.
      auto dh = kiln::to_device(hh);
      DVec<float> dy(n);
      CHECK(lanes_of(dy.view(), kiln::as_expr(dh) * 2.0f + 1) == 4);  // 8-byte loads of 4 halves
      kiln::assign(dy, dh * 2.0f + 1, gpu);
      kiln::assign(hy, hh * 2.0f + 1, cpu);
      check_close(fetch(gpu, dy), fetch(cpu, hy), 0);
      // f16 in, f16 out through a transcendental: results may differ by one f16 ulp (2^-10).
      HVec<f16> hh2(n);
      DVec<f16> dh2(n);
      kiln::assign(dh2, kiln::tanh(dh * 0.001f) + kiln::cast<f16>(part(dx, off, n)) * 0.5f, gpu);
      kiln::assign(hh2, kiln::tanh(hh * 0.001f) + kiln::cast<f16>(part(hx, off, n)) * 0.5f, cpu);
      check_close(fetch(gpu, dh2), fetch(cpu, hh2), 2e-3);
      // bf16 by implicit conversion, and back to float.
      HVec<bf16> hb(n);
      DVec<bf16> db(n);
      kiln::assign(db, part(dx, off, n), gpu);
      kiln::assign(hb, part(hx, off, n), cpu);
      check_close(fetch(gpu, db), fetch(cpu, hb), 0);
      kiln::assign(dy, db - dh, gpu);
      kiln::assign(hy, hb - hh, cpu);
      check_close(fetch(gpu, dy), fetch(cpu, hy), 0);
    }
  }
}

// ---- reductions ------------------------------------------------------------------------------

namespace {

enum class Op { sum, mean, max, min, argmax, argmin };
constexpr Op all_ops[] = {Op::sum, Op::mean, Op::max, Op::min, Op::argmax, Op::argmin};
const char* op_name(Op op) {
  constexpr const char* names[] = {"sum", "mean", "max", "min", "argmax", "argmin"};
  return names[int(op)];
}

// Evaluates red into a sentinel-filled output in Exec's space; the results in fp64.
template <reduce_over Over, class R, class Red, class Exec>
std::vector<double> evaluate(const Red& red, index_t rows, Exec& exec) {
  using S = typename Exec::space;
  const R sentinel = R(-12345);
  if constexpr (Over == reduce_over::all) {
    auto t = filled<S, R>(kiln::Shape{}, sentinel);
    kiln::assign(t, red, exec);
    return fetch(exec, t);
  } else if constexpr (Over == reduce_over::last_axis) {
    auto t = filled<S, R, dyn>(kiln::Shape{rows}, sentinel);
    kiln::assign(t, red, exec);
    return fetch(exec, t);
  } else {
    auto t = filled<S, R, dyn, dyn>(kiln::Shape{rows, 1}, sentinel);
    kiln::assign(t, red, exec);
    return fetch(exec, t);
  }
}

template <reduce_over Over, class X, class Exec>
std::vector<double> reduce_with(Op op, const X& x, index_t rows, Exec& exec) {
  using T = kiln::compute_t<typename kiln::expr_t<const X&>::value_type>;
  switch (op) {
    case Op::sum: return evaluate<Over, T>(kiln::sum<Over>(x), rows, exec);
    case Op::mean: return evaluate<Over, T>(kiln::mean<Over>(x), rows, exec);
    case Op::max: return evaluate<Over, T>(kiln::max<Over>(x), rows, exec);
    case Op::min: return evaluate<Over, T>(kiln::min<Over>(x), rows, exec);
    case Op::argmax: return evaluate<Over, std::int64_t>(kiln::argmax<Over>(x), rows, exec);
    case Op::argmin: return evaluate<Over, std::int64_t>(kiln::argmin<Over>(x), rows, exec);
  }
  return {};
}

// Every op over `dev` (on the device) and `hst` (the same values on the host), logically
// [rows, cols], with values of magnitude <= 1. tol 0 for exact inputs; otherwise sums are
// compared relative to the most their range's magnitudes add up to (its length), means to 1;
// max, min and arg* always exactly. They are skipped over empty ranges, as in the CPU suite.
template <reduce_over Over, class D, class H>
void check_reductions(const D& dev, const H& hst, index_t rows, index_t cols, double tol, Cpu& cpu, Gpu& gpu) {
  INFO("fold = [" << rows << ", " << cols << "], over the " << (Over == reduce_over::all ? "whole" : "last axis"));
  const index_t len = Over == reduce_over::all ? rows * cols : cols;
  for (Op op : all_ops) {
    if (op != Op::sum && op != Op::mean && len == 0) continue;
    INFO("op = " << op_name(op));
    const std::vector<double> got = reduce_with<Over>(op, dev, rows, gpu);
    const std::vector<double> ref = reduce_with<Over>(op, hst, rows, cpu);
    const bool sumlike = op == Op::sum || op == Op::mean;
    check_close(got, ref, sumlike ? tol : 0.0, op == Op::sum ? double(len) : 1.0);
  }
}

}  // namespace

TEST_CASE("CudaExecutor: sum, mean, max, min, argmax, argmin over every element match the CPU") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  const Domain quarters{-1, 1, false, 0.25}, unit{-1, 1};
  for (index_t n : {index_t(0), index_t(1), index_t(7), index_t(31), index_t(65536), big}) {
    INFO("n = " << n);
    HVec<float> hq(n), hc(n);
    fill(hq, quarters, rng);  // exact sums, many ties for argmax / argmin
    fill(hc, unit, rng);
    auto dq = kiln::to_device(hq), dc = kiln::to_device(hc);
    check_reductions<reduce_over::all>(dq, hq, 1, n, 0.0, cpu, gpu);
    check_reductions<reduce_over::all>(dc, hc, 1, n, 1e-6, cpu, gpu);
  }
  // Strided inputs: the per-row fold of a whole reduction.
  for (auto [R, C] : {std::pair<index_t, index_t>{7, 31}, {31, 7}, {1000, 1003}, {0, 5}}) {
    HMat<float> ha(C, R), hwide(R, C + 3);
    fill(ha, quarters, rng);
    fill(hwide, quarters, rng);
    auto da = kiln::to_device(ha), dwide = kiln::to_device(hwide);
    check_reductions<reduce_over::all>(kiln::transpose(da.view()), kiln::transpose(ha.view()), R, C, 0.0, cpu, gpu);
    check_reductions<reduce_over::all>(kiln::columns(dwide.view(), 1, C + 1), kiln::columns(hwide.view(), 1, C + 1),
                                       R, C, 0.0, cpu, gpu);
  }
}

TEST_CASE("CudaExecutor: reductions over the last axis match the CPU") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  const Domain quarters{-1, 1, false, 0.25}, unit{-1, 1};
  for (auto [R, C] : {std::pair<index_t, index_t>{1, 1}, {7, 1}, {1, 7}, {7, 31}, {31, 7}, {300, 257}, {1, big},
                      {big, 1}, {0, 5}, {3, 0}}) {
    HMat<float> hq(R, C), hc(R, C), ha(C, R);
    fill(hq, quarters, rng);
    fill(hc, unit, rng);
    fill(ha, quarters, rng);
    auto dq = kiln::to_device(hq), dc = kiln::to_device(hc), da = kiln::to_device(ha);
    check_reductions<reduce_over::last_axis>(dq, hq, R, C, 0.0, cpu, gpu);
    check_reductions<reduce_over::last_axis_keepdim>(dq, hq, R, C, 0.0, cpu, gpu);
    check_reductions<reduce_over::last_axis>(dc, hc, R, C, 1e-6, cpu, gpu);
    if (R * C < 1000000)
      check_reductions<reduce_over::last_axis>(kiln::transpose(da.view()), kiln::transpose(ha.view()), R, C, 0.0, cpu,
                                               gpu);
  }
}

TEST_CASE("CudaExecutor: fused map inputs to reductions (sum of squares) match the CPU") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  for (index_t n : {index_t(0), index_t(7), big}) {
    INFO("n = " << n);
    HVec<float> hx(n);
    fill(hx, {-1, 1, false, 0.25}, rng);  // squares are multiples of 1/16: exact sums
    auto dx = kiln::to_device(hx);
    auto ds = filled<Device, float>(kiln::Shape{}, -1.0f);
    kiln::Tensor<float, host> hs;

    gpu.stats().reset();
    kiln::assign(ds, kiln::sum(kiln::square(dx)), gpu);
    CHECK(gpu.stats().launches() == 1);
    CHECK(gpu.stats().launches(kiln::kind::reduce) == 1);
    kiln::assign(hs, kiln::sum(kiln::square(hx)), cpu);
    check_close(fetch(gpu, ds), fetch(cpu, hs), 0);

    gpu.stats().reset();
    kiln::assign<kiln::stance::force_eager>(ds, kiln::sum(kiln::square(dx)), gpu);
    CHECK(gpu.stats().launches(kiln::kind::elementwise) == 1);
    CHECK(gpu.stats().launches(kiln::kind::reduce) == 1);
    check_close(fetch(gpu, ds), fetch(cpu, hs), 0);

    kiln::assign(ds, kiln::mean(kiln::abs(dx - 1.0f)), gpu);
    kiln::assign(hs, kiln::mean(kiln::abs(hx - 1.0f)), cpu);
    check_close(fetch(gpu, ds), fetch(cpu, hs), 0);  // |x - 1| is a multiple of 1/4 too

    auto di = filled<Device, std::int64_t>(kiln::Shape{}, std::int64_t(-7));
    kiln::Tensor<std::int64_t, host> hi;
    kiln::assign(di, kiln::argmax(-kiln::square(dx - 0.5f)), gpu);  // the first element closest to 0.5
    kiln::assign(hi, kiln::argmax(-kiln::square(hx - 0.5f)), cpu);
    check_close(fetch(gpu, di), fetch(cpu, hi), 0);
  }
  // Continuous values: a million positive floats, relative to the sum.
  HVec<float> hx(big);
  fill(hx, {0, 1}, rng);
  auto dx = kiln::to_device(hx);
  kiln::Tensor<float, Device> ds;
  kiln::Tensor<float, host> hs;
  kiln::assign(ds, kiln::sum(kiln::square(dx) + dx), gpu);
  kiln::assign(hs, kiln::sum(kiln::square(hx) + hx), cpu);
  check_close(fetch(gpu, ds), fetch(cpu, hs), 1e-5);
}

// ---- matmul ----------------------------------------------------------------------------------

TEST_CASE("CudaExecutor: matmul with every transpose matches the CPU") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  struct Size {
    index_t m, n, k;
  };
  for (Size s : {Size{1, 1, 1}, Size{7, 5, 3}, Size{33, 65, 17}, Size{128, 96, 256}}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        INFO("m, n, k = " << s.m << ", " << s.n << ", " << s.k << "; ta = " << ta << ", tb = " << tb);
        HMat<float> ha = ta ? HMat<float>(s.k, s.m) : HMat<float>(s.m, s.k);
        HMat<float> hb = tb ? HMat<float>(s.n, s.k) : HMat<float>(s.k, s.n);
        HMat<float> hc(s.m, s.n);
        fill(ha, {-1, 1}, rng);
        fill(hb, {-1, 1}, rng);
        auto da = kiln::to_device(ha), db = kiln::to_device(hb);
        DMat<float> dc(s.m, s.n);
        auto op = [](auto& t, int trans) { return trans ? kiln::transpose(t.view()) : t.view(); };
        kiln::assign(dc, kiln::matmul(op(da, ta), op(db, tb)), gpu);
        kiln::assign(hc, kiln::matmul(op(ha, ta), op(hb, tb)), cpu);
        // Both accumulate k products of magnitude <= 1 in float (cuBLASLt without TF32).
        check_close(fetch(gpu, dc), fetch(cpu, hc), 1e-6, double(s.k));
        // f16 inputs, float result.
        HMat<kiln::f16> ha16(ha.shape()), hb16(hb.shape());
        kiln::assign(ha16, ha, cpu);
        kiln::assign(hb16, hb, cpu);
        auto da16 = kiln::to_device(ha16), db16 = kiln::to_device(hb16);
        kiln::assign(dc, kiln::matmul(op(da16, ta), op(db16, tb)), gpu);
        kiln::assign(hc, kiln::matmul(op(ha16, ta), op(hb16, tb)), cpu);
        check_close(fetch(gpu, dc), fetch(cpu, hc), 1e-6, double(s.k));
      }
  }
  // Empty sizes: k == 0 writes zeros, m == 0 writes nothing.
  DMat<float> da(3, 0), db(0, 4);
  auto dc = filled<Device, float, dyn, dyn>(kiln::Shape{3, 4}, 7.0f);
  kiln::assign(dc, kiln::matmul(da, db), gpu);
  check_close(fetch(gpu, dc), std::vector<double>(12, 0.0), 0);
  DMat<float> de(0, 5), df(5, 4), dg(0, 4);
  kiln::assign(dg, kiln::matmul(de, df), gpu);
  CHECK(fetch(gpu, dg).empty());
}

// ---- autograd --------------------------------------------------------------------------------

namespace {

using Grads = std::vector<std::vector<double>>;

// tanh(x·w + b)·2 + sigmoid(cb)·s − x·x summed: a row bias b [1, C], a column cb [R, 1], a
// scalar s [1, 1] (each broadcast, so their adjoints are reduced), and x used twice.
template <class Exec>
Grads map_graph(Exec& exec, const HMat<float>& x, const HMat<float>& w, const HMat<float>& b, const HMat<float>& cb,
                const HMat<float>& s) {
  using S = typename Exec::space;
  using V = kiln::ag::Var<float, S, dyn, dyn>;
  kiln::ag::Tape<Exec> tape(exec);
  V vx(to_space<S>(x), true), vw(to_space<S>(w), true), vb(to_space<S>(b), true), vcb(to_space<S>(cb), true),
      vs(to_space<S>(s), true);
  auto y = kiln::ag::map(tape, kiln::tanh(vx * vw + vb) * 2.0f + kiln::sigmoid(vcb) * vs - vx * vx);
  auto loss = kiln::ag::sum(tape, y);
  tape.backward(loss);
  return {fetch(exec, loss.value()), fetch(exec, y.value()), fetch(exec, vx.grad()), fetch(exec, vw.grad()),
          fetch(exec, vb.grad()),    fetch(exec, vcb.grad()), fetch(exec, vs.grad())};
}

// sum(op(a)·op(b) ⊙ w) with w a constant: dC = w, so every gradient is a GEMM of integers.
template <class Exec>
Grads matmul_graph(Exec& exec, const HMat<float>& a, const HMat<float>& b, const HMat<float>& w, bool ta, bool tb) {
  using S = typename Exec::space;
  using V = kiln::ag::Var<float, S, dyn, dyn>;
  kiln::ag::Tape<Exec> tape(exec);
  V va(to_space<S>(a), true), vb(to_space<S>(b), true);
  auto wt = to_space<S>(w);
  auto c = kiln::ag::matmul(tape, va, vb, ta, tb);
  auto loss = kiln::ag::sum(tape, kiln::ag::map(tape, c * wt));
  tape.backward(loss);
  return {fetch(exec, loss.value()), fetch(exec, c.value()), fetch(exec, va.grad()), fetch(exec, vb.grad())};
}

// x·xᵀ: both GEMM operands are the same variable, so its gradient gets two contributions.
template <class Exec>
Grads gram_graph(Exec& exec, const HMat<float>& x, const HMat<float>& w) {
  using S = typename Exec::space;
  kiln::ag::Tape<Exec> tape(exec);
  kiln::ag::Var<float, S, dyn, dyn> vx(to_space<S>(x), true);
  auto wt = to_space<S>(w);
  auto g = kiln::ag::matmul(tape, vx, vx, false, true);
  auto loss = kiln::ag::sum(tape, kiln::ag::map(tape, g * wt));
  tape.backward(loss);
  return {fetch(exec, loss.value()), fetch(exec, vx.grad())};
}

// mean(x); mean(mean over the last axis of x); mean(x·x): the gradients of each, in order.
template <class Exec>
Grads mean_graph(Exec& exec, const HMat<float>& x) {
  using S = typename Exec::space;
  Grads out;
  for (int which = 0; which < 3; ++which) {
    kiln::ag::Tape<Exec> tape(exec);
    kiln::ag::Var<float, S, dyn, dyn> vx(to_space<S>(x), true);
    auto loss = [&] {
      if (which == 0) return kiln::ag::mean(tape, vx);
      if (which == 1) return kiln::ag::mean(tape, kiln::ag::mean<reduce_over::last_axis>(tape, vx));
      return kiln::ag::mean(tape, kiln::ag::map(tape, vx * vx));
    }();
    tape.backward(loss);
    out.push_back(fetch(exec, loss.value()));
    out.push_back(fetch(exec, vx.grad()));
  }
  return out;
}

// Per result: a tolerance and the scale of check_close.
struct Tol {
  double tol, scale;
};

void check_grads(const Grads& got, const Grads& ref, const std::vector<Tol>& tols) {
  REQUIRE(got.size() == ref.size());
  REQUIRE(tols.size() == ref.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("result " << i);
    check_close(got[i], ref[i], tols[i].tol, tols[i].scale);
  }
}

}  // namespace

TEST_CASE("CudaExecutor: ag::map backward, with broadcast row, column and scalar inputs, matches the CPU") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  for (auto [R, C] : {std::pair<index_t, index_t>{5, 7}, {64, 129}, {300, 257}}) {
    INFO("shape = [" << R << ", " << C << "]");
    HMat<float> x(R, C), w(R, C), b(1, C), cb(R, 1), s(1, 1);
    for (auto* t : {&x, &w, &b, &cb, &s}) fill(*t, {-1.5, 1.5}, rng);
    const Grads got = map_graph(gpu, x, w, b, cb, s);
    const Grads ref = map_graph(cpu, x, w, b, cb, s);
    // Sums (the loss, the broadcast inputs' gradients) relative to the magnitudes they add up:
    // sum |y| for the loss; terms of at most 2 (b: 2(1 - t²) over R rows), 1 (cb: σ'·s over C
    // columns) and 1 (s: σ(cb) over R·C elements). Elementwise results are a few ulps apart.
    double abs_y = 0;
    for (double v : ref[1]) abs_y += std::abs(v);
    check_grads(got, ref,
                {{1e-6, abs_y}, {ftol, 1}, {ftol, 1}, {ftol, 1}, {1e-6, 2.0 * double(R)}, {1e-6, double(C)},
                 {1e-6, double(R * C)}});
  }
}

TEST_CASE("CudaExecutor: ag::matmul backward with every transpose matches the CPU") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  const Domain ints{-3, 3, false, 1};  // small integers: every GEMM here is exact in float
  const index_t m = 19, n = 23, k = 37;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      INFO("ta = " << ta << ", tb = " << tb);
      HMat<float> a = ta ? HMat<float>(k, m) : HMat<float>(m, k);
      HMat<float> b = tb ? HMat<float>(n, k) : HMat<float>(k, n);
      HMat<float> w(m, n);
      fill(a, ints, rng);
      fill(b, ints, rng);
      fill(w, ints, rng);
      const Grads got = matmul_graph(gpu, a, b, w, ta != 0, tb != 0);
      const Grads ref = matmul_graph(cpu, a, b, w, ta != 0, tb != 0);
      check_grads(got, ref, {{0, 0}, {0, 0}, {0, 0}, {0, 0}});
    }
  HMat<float> x(13, 29), w(13, 13);
  fill(x, ints, rng);
  fill(w, ints, rng);
  check_grads(gram_graph(gpu, x, w), gram_graph(cpu, x, w), {{0, 0}, {0, 0}});
}

TEST_CASE("CudaExecutor: ag::mean backward matches the CPU") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  Cpu cpu;
  Gpu gpu;
  for (auto [R, C] : {std::pair<index_t, index_t>{1, 1}, {5, 7}, {300, 257}}) {
    INFO("shape = [" << R << ", " << C << "]");
    HMat<float> x(R, C);
    fill(x, {-1, 1, false, 0.25}, rng);  // exact sums: mean(x) and mean(x·x) agree exactly
    // mean of row means sums inexact row means (in different orders); gradients are 1/n,
    // 1/R·1/C and 2x/n from the same roundings, give or take an FMA on the device.
    check_grads(mean_graph(gpu, x), mean_graph(cpu, x),
                {{0, 0}, {1e-6, 1}, {1e-6, 1}, {1e-6, 1}, {0, 0}, {1e-6, 1}});
  }
}

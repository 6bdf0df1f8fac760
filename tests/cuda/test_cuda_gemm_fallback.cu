// A plain GEMM cuBLASLt has no kernel for still runs: the executor falls back to kiln's own
// kernel (epilogue.cuh gemm_fallback). cuBLASLt's refusal is simulated (Lt::simulate_no_algorithm)
// for every plain GEMM — the real refusals are size-dependent and GPU-dependent — and the results
// are checked against an fp64 reference, over every transpose, alpha and beta, the size-1 shapes
// where real refusals happen, and float, f16 and bf16 inputs with float or input-type outputs.
//
// Tolerance: products of values in [-1, 1] summed in float in k order: 1e-5 · (sum of |terms|)
// for float outputs, plus half an ulp of the output type for f16 / bf16 outputs.
#include <doctest/doctest.h>

#include <kiln/cuda.cuh>

#include <cmath>
#include <random>
#include <type_traits>
#include <vector>

namespace {

using kiln::index_t;
namespace cu = kiln::cu;

template <class T>
std::vector<T> upload_values(const std::vector<double>& v) {
  std::vector<T> out;
  for (double x : v) out.push_back(kiln::convert<T>(float(x)));
  return out;
}

template <class T, class C>
void check_fallback(index_t m, index_t n, index_t k, bool ta, bool tb, float alpha, float beta, std::mt19937& rng) {
  INFO("m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb << " alpha=" << alpha << " beta=" << beta);
  std::uniform_real_distribution<double> u(-1, 1);
  auto draw = [&](index_t count) {
    std::vector<double> v(static_cast<std::size_t>(count));
    for (auto& x : v) x = u(rng);
    return v;
  };
  // Round the inputs through their storage types so the reference sees what the device sees.
  auto a = draw(m * k), b = draw(k * n), c = draw(m * n);
  for (auto& x : a) x = double(kiln::convert<float>(kiln::convert<T>(float(x))));
  for (auto& x : b) x = double(kiln::convert<float>(kiln::convert<T>(float(x))));
  for (auto& x : c) x = double(kiln::convert<float>(kiln::convert<C>(float(x))));
  const index_t lda = ta ? m : k, ldb = tb ? k : n;
  cu::DeviceBuffer<T> da(m * k), db(k * n);
  cu::DeviceBuffer<C> dc(m * n);
  const auto ha = upload_values<T>(a), hb = upload_values<T>(b);
  const auto hc = upload_values<C>(c);
  KILN_CUDA_CHECK(cudaMemcpy(da.data(), ha.data(), ha.size() * sizeof(T), cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemcpy(db.data(), hb.data(), hb.size() * sizeof(T), cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemcpy(dc.data(), hc.data(), hc.size() * sizeof(C), cudaMemcpyHostToDevice));

  kiln::CudaExecutor exec;
  exec.lt().simulate_no_algorithm([](const cu::MatmulArgs& x) { return x.epilogue == cu::Epilogue::none; });
  exec.gemm(ta, tb, m, n, k, alpha, da.data(), lda, db.data(), ldb, beta, dc.data(), n);
  exec.synchronize();
  CHECK(exec.gemm_fallbacks() == 1);
  std::vector<C> got(std::size_t(m * n));
  KILN_CUDA_CHECK(cudaMemcpy(got.data(), dc.data(), got.size() * sizeof(C), cudaMemcpyDeviceToHost));

  // a is stored [m, k] (or [k, m] when ta), b [k, n] (or [n, k] when tb): draw() filled them flat.
  const double out_ulp = sizeof(C) == 2 ? (std::is_same_v<C, kiln::f16> ? 0x1p-11 : 0x1p-8) : 0;
  int bad = 0;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (index_t p = 0; p < k; ++p) {
        const double x = ta ? a[std::size_t(p * lda + i)] : a[std::size_t(i * lda + p)];
        const double y = tb ? b[std::size_t(j * ldb + p)] : b[std::size_t(p * ldb + j)];
        s += x * y;
        mag += std::fabs(x * y);
      }
      const double expect = alpha * s + beta * c[std::size_t(i * n + j)];
      const double tol = 1e-5 * (std::fabs(alpha) * mag + std::fabs(beta)) + out_ulp * std::fabs(expect) + 1e-7;
      if (std::fabs(double(kiln::convert<float>(got[std::size_t(i * n + j)])) - expect) > tol) ++bad;
    }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("CudaExecutor: a plain GEMM cuBLASLt has no kernel for runs on kiln's fallback kernel") {
  std::mt19937 rng(31);
  const index_t shapes[][3] = {{1, 1, 1}, {1, 37, 5}, {29, 1, 7}, {13, 17, 1}, {33, 65, 130}};
  for (const auto& s : shapes)
    for (int t = 0; t < 4; ++t) {
      check_fallback<float, float>(s[0], s[1], s[2], t & 1, t & 2, 1.f, 0.f, rng);
      check_fallback<float, float>(s[0], s[1], s[2], t & 1, t & 2, -0.5f, 1.5f, rng);
      check_fallback<kiln::bf16, float>(s[0], s[1], s[2], t & 1, t & 2, 1.f, 1.f, rng);
      check_fallback<kiln::f16, kiln::f16>(s[0], s[1], s[2], t & 1, t & 2, 2.f, 0.f, rng);
      check_fallback<kiln::bf16, kiln::bf16>(s[0], s[1], s[2], t & 1, t & 2, 1.f, 0.f, rng);
    }
}

// Runtime tests for the CUDA backend's plumbing: error checks, device probe, caching allocator,
// pinned buffers and the cuBLASLt GEMM with its epilogues.
//
// GEMM results are compared with a plain CPU reference in double precision. Inputs are rounded to
// their storage type on the host first and the reference uses the rounded values, so the only
// errors left are the GPU's accumulation (and TF32's input rounding) and the output rounding —
// each bounded separately below, per element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/cublaslt.cuh"
#include "kiln/backend/cuda/device.cuh"
#include "kiln/backend/cuda/pinned.cuh"

using kiln::index_t;
using kiln::cu::CachingAllocator;
using kiln::cu::DeviceBuffer;
using kiln::cu::Epilogue;
using kiln::cu::Lt;
using kiln::cu::LtType;
using kiln::cu::MatmulArgs;
using kiln::cu::PinnedBuffer;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- storage types on the host ----------------------------------------------------------------

template <class T>
constexpr LtType lt_type_of() {
  if constexpr (std::is_same_v<T, float>)
    return LtType::f32;
  else if constexpr (std::is_same_v<T, __half>)
    return LtType::f16;
  else
    return LtType::bf16;
}

template <class T>
T to_storage(double v) {
  const auto f = static_cast<float>(v);
  if constexpr (std::is_same_v<T, float>)
    return f;
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(f);
  else
    return __float2bfloat16_rn(f);
}

template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, __half>)
    return static_cast<double>(__half2float(v));
  else
    return static_cast<double>(__bfloat162float(v));
}

// A row-major matrix stored as T with row stride ld; `value` holds the stored (rounded) numbers
// as double for the reference. Padding columns hold `pad_value` (NaN for inputs: a GEMM that
// reads them poisons its result).
template <class T>
struct HostMatrix {
  index_t rows = 0, cols = 0, ld = 0;
  std::vector<T> stored;
  std::vector<double> value;
  double at(index_t i, index_t j) const { return value[static_cast<std::size_t>(i * ld + j)]; }
};

template <class T>
HostMatrix<T> random_matrix(index_t rows, index_t cols, index_t ld, std::mt19937& rng,
                            double lo = -1.0, double hi = 1.0,
                            double pad_value = std::numeric_limits<double>::quiet_NaN()) {
  HostMatrix<T> m{rows, cols, ld, {}, {}};
  std::uniform_real_distribution<double> dist(lo, hi);
  m.stored.resize(static_cast<std::size_t>(rows * ld));
  m.value.resize(m.stored.size());
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < ld; ++j) {
      const auto idx = static_cast<std::size_t>(i * ld + j);
      m.stored[idx] = to_storage<T>(j < cols ? dist(rng) : pad_value);
      m.value[idx] = to_double(m.stored[idx]);
    }
  return m;
}

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> d(static_cast<index_t>(host.size()));
  KILN_CUDA_CHECK(
      cudaMemcpy(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> download(const DeviceBuffer<T>& d) {
  std::vector<T> host(static_cast<std::size_t>(d.size()));
  KILN_CUDA_CHECK(
      cudaMemcpy(host.data(), d.data(), host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// ---- reference math ---------------------------------------------------------------------------

constexpr double gelu_c = 0.044715;

double gelu_tanh(double x) {
  const double s = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(s * (x + gelu_c * x * x * x)));
}

double gelu_tanh_grad(double x) {
  const double s = std::sqrt(2.0 / std::numbers::pi);
  const double t = std::tanh(s * (x + gelu_c * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * gelu_c * x * x);
}

double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2)); }

bool is_gelu(Epilogue e) {
  return e == Epilogue::gelu || e == Epilogue::gelu_bias || e == Epilogue::gelu_aux_bias;
}

double activate(Epilogue e, double pre) {
  switch (e) {
    case Epilogue::relu:
    case Epilogue::relu_bias:
    case Epilogue::relu_aux_bias: return pre > 0.0 ? pre : 0.0;
    case Epilogue::gelu:
    case Epilogue::gelu_bias:
    case Epilogue::gelu_aux_bias: return gelu_tanh(pre);
    default: return pre;
  }
}

// How far the GPU may be from the reference: `acc` scales the sum of |terms| that went into an
// element (accumulation in f32, or TF32's rounded inputs), `out` the element's own magnitude
// (rounding to the output type).
struct Precision {
  bool tf32 = false;
  double acc = 1e-5;
  double out = 1e-6;
};

template <class Out>
Precision precision_for(bool tf32) {
  Precision p;
  p.tf32 = tf32;
  p.acc = tf32 ? 3e-3 : 1e-5;  // TF32 keeps 10 mantissa bits of each input
  if constexpr (std::is_same_v<Out, __half>)
    p.out = 1e-3;  // half ulp: 2^-11
  else if constexpr (std::is_same_v<Out, __nv_bfloat16>)
    p.out = 4e-3;  // half ulp: 2^-9
  else
    p.out = 1e-6;
  return p;
}

// Counts elements outside their tolerance and remembers the first few for the report.
struct Checker {
  index_t checked = 0;
  index_t failed = 0;
  std::ostringstream detail;

  void check(const char* what, index_t i, index_t j, double got, double expect, double tol) {
    ++checked;
    const bool ok = std::isfinite(got) && std::fabs(got - expect) <= tol;
    if (ok) return;
    if (failed < 5)
      detail << "  " << what << "[" << i << "," << j << "]: got " << got << ", expected " << expect
             << " (tolerance " << tol << ")\n";
    ++failed;
  }
  std::string report() const {
    std::ostringstream out;
    out << failed << " of " << checked << " elements outside tolerance\n" << detail.str();
    return out.str();
  }
};

// The shared Lt: one handle and plan cache for the whole suite, as a program would keep. Never
// destroyed: a static's destructor runs after the CUDA runtime has begun to unload at exit, and
// cublasLtDestroy then could turn a passing run into a crash.
Lt& test_lt() {
  static Lt* const lt = new Lt;
  return *lt;
}

// Runs x through the shared Lt. Whether cuBLASLt has a kernel for every type x transpose x
// epilogue combination is not documented (it has none for some GEMMs with a dimension of 1, which
// PyTorch keeps away from cuBLASLt): a combination without one is reported ("observed:", which
// scripts/gpu_check.sh gathers into its summary) and skipped, since kiln's promise is the
// executor's, which then falls back to a plain GEMM and its own kernel
// (tests/cuda/test_cuda_executor.cu and test_cuda_kernels.cu cover that path).
bool lt_matmul_or_report(const MatmulArgs& x) {
  try {
    test_lt().matmul(x);
    return true;
  } catch (const kiln::cu::LtNoAlgorithm& e) {
    MESSAGE("observed: cuBLASLt has no algorithm: " << e.what());
    return false;
  }
}

struct Shape {
  index_t m, n, k;
};

// alpha op(A) op(B) for row-major stored A, B, and the sum of |terms| per element.
template <class In>
void reference_product(const HostMatrix<In>& a, const HostMatrix<In>& b, index_t m, index_t n,
                       index_t k, bool ta, bool tb, std::vector<double>& prod,
                       std::vector<double>& mag) {
  prod.assign(static_cast<std::size_t>(m * n), 0.0);
  mag.assign(static_cast<std::size_t>(m * n), 0.0);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double s = 0.0, sa = 0.0;
      for (index_t p = 0; p < k; ++p) {
        const double x = ta ? a.at(p, i) : a.at(i, p);
        const double y = tb ? b.at(j, p) : b.at(p, j);
        s += x * y;
        sa += std::fabs(x * y);
      }
      prod[static_cast<std::size_t>(i * n + j)] = s;
      mag[static_cast<std::size_t>(i * n + j)] = sa;
    }
}

struct ForwardOptions {
  index_t pad = 0;  // extra elements at the end of every row of A, B, C and D
  float alpha = 1.0f;
  float beta = 0.0f;
  bool c_is_d = false;  // accumulate in place: C and D are the same buffer
};

// One forward GEMM through Lt, checked element by element against the CPU reference, and the
// padding of D checked untouched.
template <class In, class Out>
void check_forward(const Shape& s, bool ta, bool tb, Epilogue e, const Precision& prec,
                   std::mt19937& rng, const ForwardOptions& opt = {}) {
  const auto [m, n, k] = s;
  std::ostringstream name;
  name << "m=" << m << " n=" << n << " k=" << k << " trans_a=" << ta << " trans_b=" << tb
       << " in=" << kiln::cu::to_string(lt_type_of<In>())
       << " out=" << kiln::cu::to_string(lt_type_of<Out>()) << " tf32=" << prec.tf32
       << " epilogue=" << kiln::cu::to_string(e) << " pad=" << opt.pad << " alpha=" << opt.alpha
       << " beta=" << opt.beta << " c_is_d=" << opt.c_is_d;
  INFO(name.str());

  const index_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const index_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  const auto a = random_matrix<In>(a_rows, a_cols, a_cols + opt.pad, rng);
  const auto b = random_matrix<In>(b_rows, b_cols, b_cols + opt.pad, rng);
  const index_t ldd = n + opt.pad;
  const double sentinel = -777.0;
  const bool use_c = opt.beta != 0.0f;
  const auto c =
      use_c ? random_matrix<Out>(m, n, ldd, rng, -1.0, 1.0, sentinel) : HostMatrix<Out>{};
  const bool with_bias = kiln::cu::epilogue_reads_bias(e);
  const auto bias = with_bias ? random_matrix<Out>(1, n, n, rng) : HostMatrix<Out>{};

  auto d_a = upload(a.stored);
  auto d_b = upload(b.stored);
  DeviceBuffer<Out> d_c;
  if (use_c && !opt.c_is_d) d_c = upload(c.stored);
  DeviceBuffer<Out> d_bias;
  if (with_bias) d_bias = upload(bias.stored);
  std::vector<Out> d_init(static_cast<std::size_t>(m * ldd), to_storage<Out>(sentinel));
  if (opt.c_is_d) d_init = c.stored;
  auto d_d = upload(d_init);

  MatmulArgs args{
      .m = m,
      .n = n,
      .k = k,
      .trans_a = ta,
      .trans_b = tb,
      .in_type = lt_type_of<In>(),
      .out_type = lt_type_of<Out>(),
      .allow_tf32 = prec.tf32,
      .alpha = opt.alpha,
      .beta = opt.beta,
      .a = d_a.data(),
      .lda = a.ld,
      .b = d_b.data(),
      .ldb = b.ld,
      .c = use_c ? (opt.c_is_d ? static_cast<const void*>(d_d.data()) : d_c.data()) : nullptr,
      .ldc = use_c ? ldd : 0,
      .d = d_d.data(),
      .ldd = ldd,
      .epilogue = e,
      .bias = with_bias ? d_bias.data() : nullptr};
  if (!lt_matmul_or_report(args)) return;
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = download(d_d);

  std::vector<double> prod, mag;
  reference_product(a, b, m, n, k, ta, tb, prod, mag);
  Checker checker;
  for (index_t i = 0; i < m; ++i) {
    for (index_t j = 0; j < n; ++j) {
      const auto idx = static_cast<std::size_t>(i * n + j);
      double pre = opt.alpha * prod[idx];
      double scale = std::fabs(opt.alpha) * mag[idx];
      if (use_c) {
        pre += opt.beta * c.at(i, j);
        scale += std::fabs(opt.beta * c.at(i, j));
      }
      if (with_bias) {
        pre += bias.at(0, j);
        scale += std::fabs(bias.at(0, j));
      }
      const double expect = activate(e, pre);
      // 1.2 bounds the slope of every activation here (gelu' peaks at about 1.13), so an error
      // in the pre-activation reaches the output at most 1.2 times larger. GELU also gets room
      // for the device's tanh: cuBLASLt documents the form, not its accuracy, and a hardware
      // tanh approximation (about 2^-11 relative) is off by up to ~2.5e-4 |x| — 1e-3 |pre| covers
      // it four times (the dedicated test below reports what it is; kiln's executor uses these
      // epilogues only where they are float-accurate, CudaExecutor::lt_gelu_accurate).
      const double tol = prec.acc * scale * 1.2 +
                         prec.out * (std::fabs(expect) + 1.2 * std::fabs(pre)) +
                         (is_gelu(e) ? 1e-3 * std::fabs(pre) : 0.0) + 1e-6;
      checker.check("D", i, j, to_double(got[static_cast<std::size_t>(i * ldd + j)]), expect, tol);
    }
    for (index_t j = n; j < ldd; ++j)
      checker.check("D padding", i, j, to_double(got[static_cast<std::size_t>(i * ldd + j)]),
                    to_double(to_storage<Out>(sentinel)), 0.0);
  }
  INFO(checker.report());
  CHECK(checker.failed == 0);
}

const Shape odd_shapes[] = {{1, 1, 1}, {7, 13, 5}, {64, 33, 17}, {128, 256, 64}};

template <class In, class Out>
void forward_suite(bool tf32, std::initializer_list<Epilogue> epilogues, unsigned seed) {
  std::mt19937 rng(seed);
  const Precision prec = precision_for<Out>(tf32);
  for (const Shape& s : odd_shapes)
    for (int t = 0; t < 4; ++t)
      for (Epilogue e : epilogues) check_forward<In, Out>(s, t & 1, t & 2, e, prec, rng);
}

constexpr std::initializer_list<Epilogue> forward_epilogues = {Epilogue::none, Epilogue::bias,
                                                               Epilogue::relu, Epilogue::relu_bias,
                                                               Epilogue::gelu, Epilogue::gelu_bias};

}  // namespace

// ---- check macros and device probe ------------------------------------------------------------

TEST_CASE("KILN_CUDA_CHECK names the call, the place and the status, and clears the error") {
  std::string message;
  try {
    KILN_CUDA_CHECK(cudaSetDevice(-1));
  } catch (const kiln::CudaError& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(contains(message, "cudaSetDevice(-1)"));
  CHECK(contains(message, "cudaErrorInvalidDevice"));
  CHECK(contains(message, "test_cuda_runtime.cu:"));
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("KILN_CUBLAS_CHECK names the status") {
  std::string message;
  try {
    KILN_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
  } catch (const kiln::CudaError& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(contains(message, "CUBLAS_STATUS_NOT_SUPPORTED"));
  CHECK_NOTHROW(KILN_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));
}

TEST_CASE("the device probe names the device") {
  CHECK(kiln::cu::device_available());
  CHECK(kiln::cu::device_unavailable_reason().empty());
  CHECK_FALSE(kiln::cu::device_name().empty());
}

// ---- caching allocator ------------------------------------------------------------------------

TEST_CASE("CachingAllocator reuses a released block of the same size") {
  CachingAllocator alloc;
  void* p = alloc.allocate(1000);
  REQUIRE(p != nullptr);
  alloc.deallocate(p);
  void* q = alloc.allocate(1000);
  CHECK(q == p);
  const auto st = alloc.stats();
  CHECK(st.allocations == 2);
  CHECK(st.cache_hits == 1);
  alloc.deallocate(q);
}

TEST_CASE("CachingAllocator statistics: in use, peak, cached") {
  CachingAllocator alloc;
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(1000) == 1024);
  CHECK(CachingAllocator::round_size(std::size_t{1} << 20) == std::size_t{1} << 20);
  CHECK(CachingAllocator::round_size((std::size_t{1} << 20) + 1) == std::size_t{2} << 20);
  CHECK(CachingAllocator::round_size(std::size_t{3} << 20) == std::size_t{4} << 20);

  void* small = alloc.allocate(1000);                  // 1 KiB block
  void* large = alloc.allocate(std::size_t{3} << 20);  // 4 MiB block
  const std::size_t both = 1024 + (std::size_t{4} << 20);
  auto st = alloc.stats();
  CHECK(st.in_use_bytes == both);
  CHECK(st.peak_bytes == both);
  CHECK(st.cached_bytes == 0);
  CHECK(st.allocations == 2);
  CHECK(st.cache_hits == 0);

  alloc.deallocate(large);
  st = alloc.stats();
  CHECK(st.in_use_bytes == 1024);
  CHECK(st.peak_bytes == both);
  CHECK(st.cached_bytes == std::size_t{4} << 20);

  alloc.reset_peak();
  CHECK(alloc.stats().peak_bytes == 1024);

  // A small request never takes the cached large block: the pools are separate.
  void* small2 = alloc.allocate(512);
  CHECK(small2 != large);
  CHECK(alloc.stats().cache_hits == 0);

  alloc.empty_cache();
  st = alloc.stats();
  CHECK(st.cached_bytes == 0);
  CHECK(st.in_use_bytes == 1024 + 512);
  alloc.deallocate(small);
  alloc.deallocate(small2);
  CHECK(alloc.stats().in_use_bytes == 0);
  CHECK(alloc.stats().cached_bytes == 1024 + 512);
  alloc.deallocate(nullptr);                                   // a no-op
  CHECK_THROWS_AS(alloc.deallocate(small), kiln::ValueError);  // released twice
}

TEST_CASE("CachingAllocator picks the best-fitting cached block") {
  CachingAllocator alloc;
  void* b4k = alloc.allocate(4096);
  void* b2k = alloc.allocate(2048);
  void* b8k = alloc.allocate(8192);
  alloc.deallocate(b4k);
  alloc.deallocate(b2k);
  alloc.deallocate(b8k);
  void* first = alloc.allocate(2000);   // 2048 requested: the 2048 block fits best
  void* second = alloc.allocate(3000);  // 3072 requested: 4096 is the smallest that fits
  void* fresh = alloc.allocate(512);    // 8192 is more than twice 512: not spent on it
  CHECK(first == b2k);
  CHECK(second == b4k);
  CHECK(fresh != b8k);
  CHECK(alloc.stats().cache_hits == 2);
  for (void* p : {first, second, fresh}) alloc.deallocate(p);
}

TEST_CASE(
    "CachingAllocator: out of memory throws, names the request, and the allocator still works") {
  CachingAllocator alloc;
  alloc.deallocate(alloc.allocate(std::size_t{4} << 20));  // something in the cache to release
  REQUIRE(alloc.stats().cached_bytes == std::size_t{4} << 20);

  std::string message;
  try {
    (void)alloc.allocate(std::size_t{1} << 50);
  } catch (const kiln::OutOfMemoryError& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(contains(message, "requested 1125899906842624 bytes"));
  CHECK(contains(message, "in use 0 bytes"));
  CHECK(contains(message, "4194304 cached bytes were released"));
  CHECK(alloc.stats().cached_bytes == 0);  // the cache was given back before the retry
  CHECK(cudaGetLastError() == cudaSuccess);

  void* p = alloc.allocate(std::size_t{1} << 20);
  REQUIRE(p != nullptr);
  KILN_CUDA_CHECK(cudaMemset(p, 0, std::size_t{1} << 20));
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  alloc.deallocate(p);
}

TEST_CASE("DeviceBuffer is move-only and returns its block") {
  CachingAllocator alloc;
  DeviceBuffer<float> a(100, alloc);
  float* ptr = a.data();
  CHECK(a.size() == 100);
  CHECK(a.size_bytes() == 400);
  CHECK(alloc.stats().in_use_bytes == 512);

  DeviceBuffer<float> b = std::move(a);
  CHECK(a.data() == nullptr);
  CHECK(a.empty());
  CHECK(b.data() == ptr);

  DeviceBuffer<float> c;
  c = std::move(b);
  CHECK(c.data() == ptr);
  c.reset();
  CHECK(c.empty());
  CHECK(alloc.stats().in_use_bytes == 0);
  CHECK(alloc.stats().cached_bytes == 512);
  CHECK_THROWS_AS(DeviceBuffer<float>(-1, alloc), kiln::ValueError);
  CHECK(DeviceBuffer<float>(0, alloc).data() == nullptr);
}

// ---- pinned host memory -----------------------------------------------------------------------

TEST_CASE("PinnedBuffer round trip through the device") {
  constexpr index_t n = 1000;
  PinnedBuffer<float> up(n);
  for (index_t i = 0; i < n; ++i) up[i] = 0.5f * static_cast<float>(i) - 3.0f;

  cudaPointerAttributes attributes{};
  KILN_CUDA_CHECK(cudaPointerGetAttributes(&attributes, up.data()));
  CHECK(attributes.type == cudaMemoryTypeHost);  // page-locked, registered with the driver

  cudaStream_t stream = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceBuffer<float> device(n);
  PinnedBuffer<float> down(n);
  KILN_CUDA_CHECK(
      cudaMemcpyAsync(device.data(), up.data(), up.size_bytes(), cudaMemcpyHostToDevice, stream));
  KILN_CUDA_CHECK(cudaMemcpyAsync(down.data(), device.data(), down.size_bytes(),
                                  cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  KILN_CUDA_CHECK(cudaStreamDestroy(stream));
  index_t mismatches = 0;
  for (index_t i = 0; i < n; ++i) mismatches += down[i] != up[i];
  CHECK(mismatches == 0);

  float* ptr = up.data();
  PinnedBuffer<float> moved = std::move(up);
  CHECK(up.data() == nullptr);
  CHECK(moved.data() == ptr);
  CHECK(moved.span().size() == static_cast<std::size_t>(n));
  moved.reset();
  CHECK(moved.empty());
}

// ---- cuBLASLt: argument checks ----------------------------------------------------------------

TEST_CASE("Lt::validate rejects bad shapes and unsupported epilogue combinations") {
  // validate never dereferences: any non-null address stands in for device memory.
  void* fake = reinterpret_cast<void*>(std::uintptr_t{4096});
  const MatmulArgs ok{
      .m = 7, .n = 13, .k = 5, .a = fake, .lda = 5, .b = fake, .ldb = 13, .d = fake, .ldd = 13};
  CHECK_NOTHROW(Lt::validate(ok));

  auto message_of = [](const MatmulArgs& x) -> std::string {
    try {
      Lt::validate(x);
    } catch (const kiln::Error& e) {
      return e.what();
    }
    return "(no error)";
  };

  MatmulArgs x = ok;
  x.lda = 4;
  CHECK_THROWS_AS(Lt::validate(x), kiln::ShapeError);
  CHECK(contains(message_of(x), "lda must be at least 5"));
  x = ok;
  x.trans_a = true;  // A stored 5x7: lda >= 7
  CHECK(contains(message_of(x), "lda must be at least 7"));
  x = ok;
  x.ldd = 12;
  CHECK_THROWS_AS(Lt::validate(x), kiln::ShapeError);
  x = ok;
  x.k = 0;
  CHECK_THROWS_AS(Lt::validate(x), kiln::ShapeError);
  x = ok;
  x.beta = 1.0f;
  CHECK_THROWS_AS(Lt::validate(x), kiln::ValueError);  // beta reads C, and C is null
  x = ok;
  x.out_type = LtType::f16;  // f32 inputs, f16 output: not offered
  CHECK_THROWS_AS(Lt::validate(x), kiln::ValueError);
  x = ok;
  x.epilogue = Epilogue::bias;  // no bias pointer
  CHECK_THROWS_AS(Lt::validate(x), kiln::ValueError);
  x = ok;
  x.bias = fake;  // bias pointer, but epilogue none
  CHECK_THROWS_AS(Lt::validate(x), kiln::ValueError);
  x = ok;
  x.epilogue = Epilogue::relu_aux_bias;
  x.bias = fake;
  x.aux = fake;
  x.aux_ld = 64;  // bits: must be a multiple of 128
  CHECK_THROWS_AS(Lt::validate(x), kiln::ShapeError);
  CHECK(contains(message_of(x), "relu_mask_ld(n) = 128"));
  x.aux_ld = kiln::cu::relu_mask_ld(13);
  CHECK_NOTHROW(Lt::validate(x));
  x = ok;
  x.epilogue = Epilogue::dgelu_bgrad;
  x.bias = fake;
  x.aux = fake;
  x.aux_ld = 13;  // elements: must be a multiple of 8
  CHECK_THROWS_AS(Lt::validate(x), kiln::ShapeError);
  x.aux_ld = kiln::cu::gelu_aux_ld(13);
  CHECK_NOTHROW(Lt::validate(x));
  x.k = 1;  // DGELU / DRELU need k >= 2
  x.lda = 1;
  CHECK_THROWS_AS(Lt::validate(x), kiln::ShapeError);
  x = ok;
  x.epilogue = Epilogue::bgrada;
  x.bias = fake;
  CHECK_THROWS_AS(Lt::validate(x), kiln::ValueError);  // needs trans_a
  CHECK(contains(message_of(x), "trans_a = true"));
  x = ok;
  x.epilogue = Epilogue::bgradb;
  x.bias = fake;
  x.trans_b = true;
  x.ldb = 5;
  CHECK_THROWS_AS(Lt::validate(x), kiln::ValueError);  // needs !trans_b
}

// ---- cuBLASLt: forward GEMMs against the CPU reference ----------------------------------------

TEST_CASE("Lt matmul f32 (all transposes, odd shapes, forward epilogues)") {
  forward_suite<float, float>(false, forward_epilogues, 101);
}

TEST_CASE("Lt matmul f32 with TF32 multiplies (looser tolerance)") {
  forward_suite<float, float>(true, forward_epilogues, 102);
}

TEST_CASE("Lt matmul f16 -> f16") { forward_suite<__half, __half>(false, forward_epilogues, 103); }

TEST_CASE("Lt matmul bf16 -> bf16") {
  forward_suite<__nv_bfloat16, __nv_bfloat16>(false, forward_epilogues, 104);
}

TEST_CASE("Lt matmul f16 -> f32 and bf16 -> f32") {
  forward_suite<__half, float>(false, {Epilogue::none, Epilogue::bias}, 105);
  forward_suite<__nv_bfloat16, float>(false, {Epilogue::none, Epilogue::bias}, 106);
}

TEST_CASE("Lt matmul honours padded leading dimensions, alpha and beta") {
  std::mt19937 rng(107);
  const Shape s{33, 47, 29};
  for (int t = 0; t < 4; ++t) {
    check_forward<float, float>(s, t & 1, t & 2, Epilogue::none, precision_for<float>(false), rng,
                                {.pad = 3, .alpha = 0.5f, .beta = -1.5f});
    check_forward<float, float>(s, t & 1, t & 2, Epilogue::bias, precision_for<float>(false), rng,
                                {.pad = 5, .alpha = 2.0f, .beta = 0.25f, .c_is_d = true});
    check_forward<__nv_bfloat16, __nv_bfloat16>(
        s, t & 1, t & 2, Epilogue::relu_bias, precision_for<__nv_bfloat16>(false), rng,
        {.pad = 8, .alpha = 1.0f, .beta = 1.0f, .c_is_d = true});
  }
}

TEST_CASE("Lt GELU epilogue is the tanh approximation, not erf") {
  // A = [1, 0] per row and B's second row zero make the pre-activation exactly the value in B's
  // first row, spread over [-5, 5], so the comparison sees the activation alone (k = 2: cuBLASLt
  // may have no kernel for k = 1). The two forms differ by up to 4.7e-4 (at |x| = 2.7, and by more
  // than 2e-4 on a third of these points); f32 output is good to about 1e-6. cuBLASLt documents
  // the tanh form; how closely its tanh follows the exact one nobody has measured here: the
  // test reports it ("observed:") and checks only the documented contract — far closer to
  // tanh-GELU than to erf-GELU. kiln's own gelu_tanh kernel is held to the tight bound
  // (test_cuda_executor.cu).
  constexpr index_t m = 2, n = 4096, k = 2;
  const std::vector<float> a{1.0f, 0.0f, 1.0f, 0.0f};
  std::vector<float> b(static_cast<std::size_t>(k * n), 0.0f);
  for (index_t j = 0; j < n; ++j)
    b[static_cast<std::size_t>(j)] = -5.0f + 10.0f * static_cast<float>(j) / (n - 1);
  auto d_a = upload(a);
  auto d_b = upload(b);
  DeviceBuffer<float> d_d(m * n);
  if (!lt_matmul_or_report({.m = m,
                            .n = n,
                            .k = k,
                            .a = d_a.data(),
                            .lda = k,
                            .b = d_b.data(),
                            .ldb = n,
                            .d = d_d.data(),
                            .ldd = n,
                            .epilogue = Epilogue::gelu}))
    return;
  const auto got = download(d_d);
  double worst_tanh = 0.0, worst_erf = 0.0, worst_tanh_rel = 0.0;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      const double x = b[static_cast<std::size_t>(j)];
      const double g = got[static_cast<std::size_t>(i * n + j)];
      worst_tanh = std::max(worst_tanh, std::fabs(g - gelu_tanh(x)));
      worst_tanh_rel = std::max(worst_tanh_rel, (std::fabs(g - gelu_tanh(x)) - 1e-6) / std::max(std::fabs(x), 1e-3));
      worst_erf = std::max(worst_erf, std::fabs(g - gelu_erf(x)));
    }
  MESSAGE("observed: cuBLASLt GELU epilogue: largest difference from tanh-GELU " << worst_tanh << ", from erf-GELU "
                                                                                << worst_erf << "; relative to |x|, "
                                                                                << worst_tanh_rel);
  // The contract: tanh-GELU up to the device's tanh. A float-accurate tanh puts it far closer to
  // tanh-GELU than to erf-GELU (the forms differ by up to 4.7e-4); a hardware approximation (up to
  // ~2.5e-4 |x| here) can blur that difference, so then only the bound holds — and kiln's executor
  // runs its own GELU kernel (CudaExecutor::lt_gelu_accurate).
  CHECK(worst_tanh_rel <= 1e-3);
  if (worst_tanh_rel <= 2e-5) CHECK(worst_tanh < worst_erf / 4);
}

// ---- cuBLASLt: training epilogues (aux, activation gradients, bias gradients) -----------------

namespace {

// Forward H = act(X W^T + b) saving aux, then backward dPre = (G W2) * act'(pre) with the bias
// gradient db = column sums of dPre — the Linear + activation pair of an MLP.
//   X [m, k], W [n, k] (trans_b), b [n];  G [m, p], W2 [p, n];  k = p >= 2 for the backward.
template <class T>
void check_activation_pair(bool relu, index_t m, index_t n, index_t k, index_t p,
                           std::mt19937& rng) {
  std::ostringstream name;
  name << (relu ? "relu" : "gelu") << " pair, m=" << m << " n=" << n << " k=" << k << " p=" << p
       << " type=" << kiln::cu::to_string(lt_type_of<T>());
  INFO(name.str());
  const Precision prec = precision_for<T>(false);

  const auto x = random_matrix<T>(m, k, k, rng);
  const auto w = random_matrix<T>(n, k, k, rng);
  const auto b = random_matrix<T>(1, n, n, rng);
  auto d_x = upload(x.stored);
  auto d_w = upload(w.stored);
  auto d_b = upload(b.stored);
  DeviceBuffer<T> d_h(m * n);

  const index_t aux_ld = relu ? kiln::cu::relu_mask_ld(n) : kiln::cu::gelu_aux_ld(n);
  DeviceBuffer<std::uint8_t> d_mask(relu ? kiln::cu::relu_mask_bytes(m, n) : 0);
  DeviceBuffer<T> d_pre(relu ? 0 : m * aux_ld);
  void* aux = relu ? static_cast<void*>(d_mask.data()) : static_cast<void*>(d_pre.data());
  if (relu) KILN_CUDA_CHECK(cudaMemset(d_mask.data(), 0, d_mask.size_bytes()));

  if (!lt_matmul_or_report({.m = m,
                            .n = n,
                            .k = k,
                            .trans_b = true,
                            .in_type = lt_type_of<T>(),
                            .out_type = lt_type_of<T>(),
                            .a = d_x.data(),
                            .lda = k,
                            .b = d_w.data(),
                            .ldb = k,
                            .d = d_h.data(),
                            .ldd = n,
                            .epilogue = relu ? Epilogue::relu_aux_bias : Epilogue::gelu_aux_bias,
                            .bias = d_b.data(),
                            .aux = aux,
                            .aux_ld = aux_ld})) return;
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto h = download(d_h);
  const auto pre_gpu = relu ? std::vector<T>{} : download(d_pre);

  std::vector<double> prod, mag;
  reference_product(x, w, m, n, k, false, true, prod, mag);
  Checker forward;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      const auto idx = static_cast<std::size_t>(i * n + j);
      const double pre = prod[idx] + b.at(0, j);
      const double scale = mag[idx] + std::fabs(b.at(0, j));
      const double expect = relu ? std::max(pre, 0.0) : gelu_tanh(pre);
      forward.check("H", i, j, to_double(h[idx]), expect,
                    prec.acc * scale * 1.2 + prec.out * (std::fabs(expect) + 1.2 * std::fabs(pre)) +
                        (relu ? 0.0 : 1e-3 * std::fabs(pre)) + 1e-6);  // the device's tanh: see check_forward
      if (!relu)
        forward.check("aux (GELU input)", i, j,
                      to_double(pre_gpu[static_cast<std::size_t>(i * aux_ld + j)]), pre,
                      prec.acc * scale + prec.out * std::fabs(pre) + 1e-6);
    }
  INFO("forward: " << forward.report());
  CHECK(forward.failed == 0);

  // Backward: dPre = (G W2) * act'(pre); db = column sums of dPre.
  const auto g = random_matrix<T>(m, p, p, rng);
  const auto w2 = random_matrix<T>(p, n, n, rng);
  auto d_g = upload(g.stored);
  auto d_w2 = upload(w2.stored);
  DeviceBuffer<T> d_dpre(m * n);
  DeviceBuffer<T> d_db(n);
  if (!lt_matmul_or_report({.m = m,
                            .n = n,
                            .k = p,
                            .in_type = lt_type_of<T>(),
                            .out_type = lt_type_of<T>(),
                            .a = d_g.data(),
                            .lda = p,
                            .b = d_w2.data(),
                            .ldb = n,
                            .d = d_dpre.data(),
                            .ldd = n,
                            .epilogue = relu ? Epilogue::drelu_bgrad : Epilogue::dgelu_bgrad,
                            .bias = d_db.data(),
                            .aux = aux,
                            .aux_ld = aux_ld})) return;
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto dpre = download(d_dpre);
  const auto db = download(d_db);

  reference_product(g, w2, m, n, p, false, false, prod, mag);
  Checker backward;
  std::vector<double> db_expect(static_cast<std::size_t>(n), 0.0);
  std::vector<double> db_tol(static_cast<std::size_t>(n), 0.0);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      const auto idx = static_cast<std::size_t>(i * n + j);
      // The derivative is taken where the GPU took it: the ReLU mask is "H > 0" of the GPU's own
      // forward output (pre > 0 exactly when relu(pre) > 0), the GELU input is the GPU's aux.
      const double slope =
          relu ? (to_double(h[idx]) > 0.0 ? 1.0 : 0.0)
               : gelu_tanh_grad(to_double(pre_gpu[static_cast<std::size_t>(i * aux_ld + j)]));
      const double expect = prod[idx] * slope;
      // Room for the device's own evaluation of gelu': 3e-3 on a slope in [-0.13, 1.13] (a hardware
      // tanh approximation's ~2^-11 relative error, amplified by gelu''s x (1 - t^2) term: ~1.5e-3
      // at |x| = 2).
      const double tol = prec.acc * mag[idx] * std::fabs(slope) * 1.01 +
                         prec.out * std::fabs(expect) + (relu ? 0.0 : 3e-3 * std::fabs(prod[idx])) +
                         1e-6;
      backward.check("dPre", i, j, to_double(dpre[idx]), expect, tol);
      db_expect[static_cast<std::size_t>(j)] += expect;
      db_tol[static_cast<std::size_t>(j)] += tol;
    }
  for (index_t j = 0; j < n; ++j) {
    const auto jj = static_cast<std::size_t>(j);
    backward.check("db", 0, j, to_double(db[jj]), db_expect[jj],
                   db_tol[jj] + prec.out * std::fabs(db_expect[jj]) + 1e-6);
  }
  INFO("backward: " << backward.report());
  CHECK(backward.failed == 0);
}

// D = op(A) op(B) with the bias gradient of one operand: bgrada sums op(A) over k (length m,
// needs trans_a), bgradb sums op(B) over k (length n, needs !trans_b).
template <class T>
void check_bias_gradient(Epilogue e, const Shape& s, bool ta, bool tb, std::mt19937& rng) {
  const auto [m, n, k] = s;
  std::ostringstream name;
  name << kiln::cu::to_string(e) << " m=" << m << " n=" << n << " k=" << k << " trans_a=" << ta
       << " trans_b=" << tb << " type=" << kiln::cu::to_string(lt_type_of<T>());
  INFO(name.str());
  const Precision prec = precision_for<T>(false);
  const index_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const index_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  const auto a = random_matrix<T>(a_rows, a_cols, a_cols, rng);
  const auto b = random_matrix<T>(b_rows, b_cols, b_cols, rng);
  auto d_a = upload(a.stored);
  auto d_b = upload(b.stored);
  DeviceBuffer<T> d_d(m * n);
  const index_t len = kiln::cu::epilogue_bias_length(e, m, n);
  DeviceBuffer<T> d_db(len);
  if (!lt_matmul_or_report({.m = m,
                            .n = n,
                            .k = k,
                            .trans_a = ta,
                            .trans_b = tb,
                            .in_type = lt_type_of<T>(),
                            .out_type = lt_type_of<T>(),
                            .a = d_a.data(),
                            .lda = a_cols,
                            .b = d_b.data(),
                            .ldb = b_cols,
                            .d = d_d.data(),
                            .ldd = n,
                            .epilogue = e,
                            .bias = d_db.data()})) return;
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto d = download(d_d);
  const auto db = download(d_db);

  std::vector<double> prod, mag;
  reference_product(a, b, m, n, k, ta, tb, prod, mag);
  Checker checker;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      const auto idx = static_cast<std::size_t>(i * n + j);
      checker.check("D", i, j, to_double(d[idx]), prod[idx],
                    prec.acc * mag[idx] + prec.out * std::fabs(prod[idx]) + 1e-6);
    }
  for (index_t r = 0; r < len; ++r) {
    double sum = 0.0, sum_abs = 0.0;
    for (index_t p = 0; p < k; ++p) {
      // bgrada: op(A)[r, p]; bgradb: op(B)[p, r].
      const double v =
          e == Epilogue::bgrada ? (ta ? a.at(p, r) : a.at(r, p)) : (tb ? b.at(r, p) : b.at(p, r));
      sum += v;
      sum_abs += std::fabs(v);
    }
    checker.check("bias gradient", 0, r, to_double(db[static_cast<std::size_t>(r)]), sum,
                  prec.acc * sum_abs + prec.out * std::fabs(sum) + 1e-6);
  }
  INFO(checker.report());
  CHECK(checker.failed == 0);
}

}  // namespace

TEST_CASE("Lt relu_aux_bias forward, then drelu_bgrad: dX = dY * (pre > 0), db = column sums") {
  std::mt19937 rng(201);
  for (const auto& [m, n, k, p] :
       {std::array<index_t, 4>{7, 13, 5, 2}, {64, 33, 17, 5}, {128, 256, 64, 48}}) {
    check_activation_pair<float>(true, m, n, k, p, rng);
    check_activation_pair<__half>(true, m, n, k, p, rng);
    check_activation_pair<__nv_bfloat16>(true, m, n, k, p, rng);
  }
}

TEST_CASE("Lt gelu_aux_bias forward, then dgelu_bgrad") {
  std::mt19937 rng(202);
  for (const auto& [m, n, k, p] :
       {std::array<index_t, 4>{7, 13, 5, 2}, {64, 33, 17, 5}, {128, 256, 64, 48}}) {
    check_activation_pair<float>(false, m, n, k, p, rng);
    check_activation_pair<__half>(false, m, n, k, p, rng);
    check_activation_pair<__nv_bfloat16>(false, m, n, k, p, rng);
  }
}

TEST_CASE("Lt bgrada (needs trans_a) and bgradb (needs !trans_b)") {
  std::mt19937 rng(203);
  for (const Shape& s : {Shape{7, 13, 5}, Shape{64, 33, 17}, Shape{128, 256, 64}}) {
    for (bool other : {false, true}) {
      check_bias_gradient<float>(Epilogue::bgrada, s, true, other, rng);
      check_bias_gradient<float>(Epilogue::bgradb, s, other, false, rng);
      check_bias_gradient<__nv_bfloat16>(Epilogue::bgrada, s, true, other, rng);
      check_bias_gradient<__nv_bfloat16>(Epilogue::bgradb, s, other, false, rng);
      check_bias_gradient<__half>(Epilogue::bgrada, s, true, other, rng);
      check_bias_gradient<__half>(Epilogue::bgradb, s, other, false, rng);
    }
  }
}

TEST_CASE("Lt caches one plan per problem and reuses it") {
  Lt lt(std::size_t{4} << 20);
  std::vector<float> host(64 * 64, 0.25f);
  auto d_a = upload(host);
  auto d_b = upload(host);
  DeviceBuffer<float> d_d(64 * 64);
  const MatmulArgs args{.m = 64,
                        .n = 64,
                        .k = 64,
                        .a = d_a.data(),
                        .lda = 64,
                        .b = d_b.data(),
                        .ldb = 64,
                        .d = d_d.data(),
                        .ldd = 64};
  lt.matmul(args);
  lt.matmul(args);
  CHECK(lt.cached_plans() == 1);
  MatmulArgs other = args;
  other.m = 32;
  lt.matmul(other);
  CHECK(lt.cached_plans() == 2);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto d = download(d_d);
  CHECK(d[0] == doctest::Approx(64 * 0.25 * 0.25));
  lt.clear_plans();
  CHECK(lt.cached_plans() == 0);
}

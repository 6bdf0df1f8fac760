// bench/gemm — kiln's own CPU GEMM against CBLAS (OpenBLAS) on the GEMMs of training an MLP
// 400-256-128-10, single thread.
//
// Per layer (in -> out) and batch B: forward Y = X W^T (B x out, k = in), backward
// dX = dY W (B x in, k = out) and dW += dY^T X (out x in, k = B, beta = 1 as gradients add up).
// Each line on stdout is one JSON measurement; own and cblas samples alternate so that load from
// other processes hits both alike. A summary table goes to stderr.
//
// usage: gemm [seconds per measurement, default 0.3]
#include <kiln/backend/cpu/gemm.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include "timing.hpp"

namespace {

using kiln::index_t;
using kiln::cpu::trans;
using clock_type = std::chrono::steady_clock;

struct shape {
  const char* op;
  index_t m, n, k;
  trans ta, tb;
  float beta;
};

enum class impl { own, cblas };

struct operands {
  std::vector<float> a, b, c;
  explicit operands(const shape& s) : a(s.m * s.k), b(s.k * s.n), c(s.m * s.n) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (float& x : a) x = d(rng);
    for (float& x : b) x = d(rng);
    for (float& x : c) x = d(rng) * 1e-3f;
  }
};

void call(impl which, const shape& s, operands& o) {
  const index_t lda = s.ta == trans::yes ? s.m : s.k, ldb = s.tb == trans::yes ? s.k : s.n;
  if (which == impl::own) {
    kiln::cpu::gemm_own(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a.data(), lda, o.b.data(), ldb, s.beta,
                        o.c.data(), s.n, 1);
  } else {
    kiln::cpu::gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a.data(), lda, o.b.data(), ldb, s.beta,
                    o.c.data(), s.n, 1);
  }
}

// Seconds per call for `reps` back-to-back calls.
double sample(impl which, const shape& s, operands& o, int reps) {
  const auto t0 = clock_type::now();
  for (int r = 0; r < reps; ++r) call(which, s, o);
  return std::chrono::duration<double>(clock_type::now() - t0).count() / reps;
}

using kiln_bench::median;

// The microkernel kiln's own GEMM was compiled with (chosen from the target flags), e.g.
// "avx512 12x32".
const char* own_kernel() {
  static char name[32];
  using blk = kiln::cpu::detail::gemm_blocking<float>;
  std::snprintf(name, sizeof name, "%s %dx%d",
                KILN_GEMM_AVX512 ? "avx512" : KILN_GEMM_AVX2 ? "avx2" : "portable", blk::mr, blk::nr);
  return name;
}

}  // namespace

int main(int argc, char** argv) {
  const double budget = argc > 1 ? std::atof(argv[1]) : 0.3;
  std::vector<impl> impls = {impl::own};
#if defined(KILN_HAVE_CBLAS)
  kiln::cpu::set_gemm_backend(kiln::cpu::gemm_backend::cblas);
  impls.push_back(impl::cblas);
#endif
  std::vector<shape> shapes;
  const index_t layers[][2] = {{400, 256}, {256, 128}, {128, 10}};
  for (index_t batch : {64, 256, 1024}) {
    for (const auto& l : layers) {
      const index_t in = l[0], out = l[1];
      shapes.push_back({"fwd", batch, out, in, trans::no, trans::yes, 0.0f});
      shapes.push_back({"dx", batch, in, out, trans::no, trans::no, 0.0f});
      shapes.push_back({"dw", out, in, batch, trans::yes, trans::no, 1.0f});
    }
  }

  std::fprintf(stderr, "own microkernel: %s (float)\n", own_kernel());
  std::fprintf(stderr, "%-4s %5s %5s %5s %3s %3s  %9s %9s  %s\n", "op", "m", "n", "k", "ta", "tb",
               "own GF/s", "cblas GF/s", "own/cblas");
  for (const shape& s : shapes) {
    operands o(s);
    const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
    // Warm up (packing buffers, OpenBLAS threads, caches) and size a sample to ~100 us.
    for (impl w : impls) sample(w, s, o, 3);
    const double once = sample(impl::own, s, o, 5);
    const int reps = std::max(1, static_cast<int>(100e-6 / once));
    const int samples = std::max(11, static_cast<int>(budget / (once * reps * impls.size())));
    std::vector<std::vector<double>> times(impls.size());
    for (int i = 0; i < samples; ++i)
      for (std::size_t w = 0; w < impls.size(); ++w)
        times[w].push_back(sample(impls[w], s, o, reps));

    double gf[2] = {0, 0};
    for (std::size_t w = 0; w < impls.size(); ++w) {
      const double t = median(times[w]);
      gf[w] = flops / t * 1e-9;
      std::printf(
          "{\"bench\":\"gemm\",\"impl\":\"%s\",\"kernel\":\"%s\",\"op\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,"
          "\"ta\":\"%s\","
          "\"tb\":\"%s\",\"beta\":%g,\"threads\":1,\"samples\":%d,\"reps\":%d,\"median_s\":%.4e,"
          "\"gflops\":%.2f}\n",
          impls[w] == impl::own ? "own" : "cblas", impls[w] == impl::own ? own_kernel() : "cblas",
          s.op, static_cast<long long>(s.m),
          static_cast<long long>(s.n), static_cast<long long>(s.k),
          s.ta == trans::yes ? "yes" : "no", s.tb == trans::yes ? "yes" : "no", double(s.beta),
          samples, reps, t, gf[w]);
    }
    std::fflush(stdout);
    std::fprintf(stderr, "%-4s %5lld %5lld %5lld %3s %3s  %9.1f %9.1f  %6.2f\n", s.op,
                 static_cast<long long>(s.m), static_cast<long long>(s.n),
                 static_cast<long long>(s.k), s.ta == trans::yes ? "T" : "N",
                 s.tb == trans::yes ? "T" : "N", gf[0], gf[1], gf[1] > 0 ? gf[0] / gf[1] : 0.0);
  }
  return 0;
}

// bench/gemm — kiln's own CPU GEMM against CBLAS (OpenBLAS) on the GEMMs of training an MLP
// 400-256-128-10, single thread, in fp32 and with kiln::bf16 inputs (fp32 accumulation and C).
//
// Per layer (in -> out) and batch B: forward Y = X W^T (B x out, k = in), backward
// dX = dY W (B x in, k = out) and dW += dY^T X (out x in, k = B, beta = 1 as gradients add up).
// Each line on stdout is one JSON measurement; the samples of all implementations alternate so
// that load from other processes hits them alike. Implementations: own and cblas (fp32), bf16
// (kiln's own GEMM on bf16 inputs, with the kernel current_gemm_bf16_path() picks: AMX tiles where
// usable, else vdpbf16ps where compiled in), bf16_native (vdpbf16ps, when AMX is the default) and
// bf16_emulate (the exact float emulation, when a native kernel is the default) for comparison.
// bf16 lines carry "vs_fp32": their GF/s over own fp32's on the same shape and run. After the MLP's
// shapes, four of ResNet-50's at batch 8 (layer1's 1x1 convolutions forward, a 3x3 layer2
// convolution as im2col + GEMM forward and its weight gradient).
// A summary table goes to stderr.
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

enum class impl { own, cblas, bf16, bf16_native, bf16_emulate };

const char* impl_name(impl i) {
  switch (i) {
    case impl::own: return "own";
    case impl::cblas: return "cblas";
    case impl::bf16: return "bf16";
    case impl::bf16_native: return "bf16_native";
    case impl::bf16_emulate: return "bf16_emulate";
  }
  return "?";
}
bool is_bf16(impl i) { return i == impl::bf16 || i == impl::bf16_native || i == impl::bf16_emulate; }

struct operands {
  std::vector<float> a, b, c;
  std::vector<kiln::bf16> ah, bh;  // a and b rounded to bf16
  explicit operands(const shape& s) : a(s.m * s.k), b(s.k * s.n), c(s.m * s.n) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (float& x : a) x = d(rng);
    for (float& x : b) x = d(rng);
    for (float& x : c) x = d(rng) * 1e-3f;
    for (float x : a) ah.push_back(kiln::bf16(x));
    for (float x : b) bh.push_back(kiln::bf16(x));
  }
};

void call(impl which, const shape& s, operands& o) {
  const index_t lda = s.ta == trans::yes ? s.m : s.k, ldb = s.tb == trans::yes ? s.k : s.n;
  if (which == impl::own) {
    kiln::cpu::gemm_own(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a.data(), lda, o.b.data(), ldb, s.beta,
                        o.c.data(), s.n, 1);
  } else if (which == impl::cblas) {
    kiln::cpu::gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a.data(), lda, o.b.data(), ldb, s.beta,
                    o.c.data(), s.n, 1);
  } else {
    const auto path = which == impl::bf16_emulate  ? kiln::cpu::gemm_bf16_path::emulate
                      : which == impl::bf16_native ? kiln::cpu::gemm_bf16_path::native
                                                   : kiln::cpu::current_gemm_bf16_path();
    const auto before = kiln::cpu::current_gemm_bf16_path();
    kiln::cpu::set_gemm_bf16_path(path);
    kiln::cpu::gemm_own(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.ah.data(), lda, o.bh.data(), ldb,
                        s.beta, o.c.data(), s.n, 1);
    kiln::cpu::set_gemm_bf16_path(before);
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

// The kernel bf16 inputs run on: "amx 32x32", "avx512bf16 12x32" (vdpbf16ps) or "emulate <fp32
// kernel>".
const char* bf16_kernel(kiln::cpu::gemm_bf16_path path) {
  static char name[48];
#if KILN_GEMM_BF16_AMX
  if (path == kiln::cpu::gemm_bf16_path::amx) return kiln::cpu::detail::gemm_kernel_amx::name;
#endif
#if KILN_GEMM_BF16_NATIVE
  if (path == kiln::cpu::gemm_bf16_path::native) return kiln::cpu::detail::gemm_kernel_bf16::name;
#endif
  (void)path;
  std::snprintf(name, sizeof name, "emulate %s", own_kernel());
  return name;
}

const char* kernel_of(impl i) {
  switch (i) {
    case impl::own: return own_kernel();
    case impl::cblas: return "cblas";
    case impl::bf16: return bf16_kernel(kiln::cpu::current_gemm_bf16_path());
    case impl::bf16_native: return bf16_kernel(kiln::cpu::gemm_bf16_path::native);
    case impl::bf16_emulate: return bf16_kernel(kiln::cpu::gemm_bf16_path::emulate);
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  const double budget = argc > 1 ? std::atof(argv[1]) : 0.3;
  std::vector<impl> impls = {impl::own};
#if defined(KILN_HAVE_CBLAS)
  kiln::cpu::set_gemm_backend(kiln::cpu::gemm_backend::cblas);
  impls.push_back(impl::cblas);
#endif
  impls.push_back(impl::bf16);
  if (kiln::cpu::current_gemm_bf16_path() == kiln::cpu::gemm_bf16_path::amx) impls.push_back(impl::bf16_native);
  if (kiln::cpu::current_gemm_bf16_path() != kiln::cpu::gemm_bf16_path::emulate)
    impls.push_back(impl::bf16_emulate);
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
  const index_t pixels56 = 8 * 56 * 56, pixels28 = 8 * 28 * 28;  // NHWC rows at batch 8
  shapes.push_back({"c1x1", pixels56, 256, 64, trans::no, trans::yes, 0.0f});
  shapes.push_back({"c1x1", pixels56, 64, 256, trans::no, trans::yes, 0.0f});
  shapes.push_back({"c3x3", pixels28, 128, 128 * 9, trans::no, trans::yes, 0.0f});
  shapes.push_back({"c3dw", 128, 128 * 9, pixels28, trans::yes, trans::no, 1.0f});

  std::fprintf(stderr, "own microkernel: %s (float), bf16: %s\n", own_kernel(),
               kernel_of(impl::bf16));
  std::fprintf(stderr, "%-4s %5s %5s %5s %3s %3s", "op", "m", "n", "k", "ta", "tb");
  for (impl w : impls) std::fprintf(stderr, " %12s", impl_name(w));
  std::fprintf(stderr, "   GF/s; own/cblas bf16/own\n");
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

    std::vector<double> med(impls.size()), gf(impls.size());
    for (std::size_t w = 0; w < impls.size(); ++w) {
      med[w] = median(times[w]);
      gf[w] = flops / med[w] * 1e-9;
    }
    for (std::size_t w = 0; w < impls.size(); ++w) {
      char vs[48] = "";
      if (is_bf16(impls[w])) std::snprintf(vs, sizeof vs, ",\"vs_fp32\":%.3f", gf[w] / gf[0]);
      std::printf(
          "{\"bench\":\"gemm\",\"impl\":\"%s\",\"dtype\":\"%s\",\"kernel\":\"%s\",\"op\":\"%s\","
          "\"m\":%lld,\"n\":%lld,\"k\":%lld,\"ta\":\"%s\",\"tb\":\"%s\",\"beta\":%g,\"threads\":1,"
          "\"samples\":%d,\"reps\":%d,\"median_s\":%.4e,\"gflops\":%.2f%s}\n",
          impl_name(impls[w]), is_bf16(impls[w]) ? "bf16" : "f32", kernel_of(impls[w]), s.op,
          static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
          s.ta == trans::yes ? "yes" : "no", s.tb == trans::yes ? "yes" : "no", double(s.beta),
          samples, reps, med[w], gf[w], vs);
    }
    std::fflush(stdout);
    std::fprintf(stderr, "%-4s %5lld %5lld %5lld %3s %3s", s.op, static_cast<long long>(s.m),
                 static_cast<long long>(s.n), static_cast<long long>(s.k),
                 s.ta == trans::yes ? "T" : "N", s.tb == trans::yes ? "T" : "N");
    for (double x : gf) std::fprintf(stderr, " %12.1f", x);
    auto gf_of = [&](impl i) {
      const auto at = std::find(impls.begin(), impls.end(), i);
      return at == impls.end() ? 0.0 : gf[static_cast<std::size_t>(at - impls.begin())];
    };
    const double cb = gf_of(impl::cblas);
    std::fprintf(stderr, "   %9.2f %7.2f\n", cb > 0 ? gf[0] / cb : 0.0, gf_of(impl::bf16) / gf[0]);
  }
  return 0;
}

// bench/fusion.cpp — the claim: an elementwise chain of k ops runs as ONE pass over memory.
//
// For k = 1..8 cheap ops (mul, add, max, mul, sub, add, mul, min; k = 5 is ((x·a + b) max 0)·c − d)
// over N float32 values, times the fused assignment against stance::force_eager (one kernel per
// op) on the same CpuExecutor, and measures the machine's copy bandwidth in the same run
// (std::memcpy of N floats between the same buffers). A fused chain moves one read and one write
// of N floats, 8N bytes, like the copy; eager moves about k times that.
//
// Targets on the 2-core CI machine: k = 5 fused_over_eager >= 4.5, frac_of_copy >= 0.9.
// A second chain of transcendental ops (exp, tanh, sigmoid) is compute-bound: it reports the
// fused/eager ratio only.
//
// Its peers, run first (before anything of kiln's is timed, so they never share the cores):
// PyTorch eager and torch.compile of the same chain on the same N, reps and thread count
// (bench/torch_fusion.py through popen); their line is copied to stdout and followed by
// "fusion_transcendental_peers": kiln_fused_s, torch_eager_s, torch_compiled_s and the ratios
// torch_*_over_kiln_fused (> 1: kiln faster; null where a peer gave no time). A peer that
// cannot run prints its "skipped" reason instead.
//
// Output: one JSON line per measurement. Flags: --n N (default 2^24), --reps R (default 11,
// at least 3), --threads T (default 0: all OpenMP threads), --python PY (the peers'
// interpreter: default .venv-bench/bin/python in the source tree when it exists, else
// /usr/bin/python3; "none" runs no peer).
#include <kiln.hpp>

#include "chains.hpp"
#include "mlp_step.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#include "timing.hpp"
#endif

namespace {

using kiln::index_t;
using Vec = kiln::Tensor<float, kiln::host, kiln::dyn>;

struct Options {
  index_t n = index_t(1) << 24;
  int reps = 11;
  int threads = 0;
  std::string python = kiln_bench::default_python();
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fusion: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--n") o.n = std::atoll(value());
    else if (a == "--reps") o.reps = std::atoi(value());
    else if (a == "--threads") o.threads = std::atoi(value());
    else if (a == "--python") o.python = value();
    else {
      std::fprintf(stderr, "usage: fusion [--n N] [--reps R] [--threads T] [--python PY|none]\n");
      std::exit(2);
    }
  }
  if (o.n < 1 || o.reps < 3 || o.threads < 0) {
    std::fprintf(stderr, "fusion: need --n >= 1, --reps >= 3, --threads >= 0\n");
    std::exit(2);
  }
  return o;
}

using kiln_bench::median;

using kiln_bench::seconds;

using kiln_bench::chain;

auto transcendental(const Vec& x) { return kiln::sigmoid(kiln::tanh(kiln::exp(x))); }

double max_abs_diff(const Vec& p, const Vec& q) {
  double m = 0;
  for (index_t i = 0; i < p.size(); ++i) m = std::max(m, double(std::abs(p.data()[i] - q.data()[i])));
  return m;
}

struct Timing {
  double fused_s, eager_s;
};

// Medians over reps of the fused and the eager assignment, interleaved so that a slow moment of
// the machine hits both alike, after one warm-up of each (which also fills the scratch pool).
template <class Make>
Timing time_pair(kiln::CpuExecutor& exec, Vec& y_fused, Vec& y_eager, Make make, int reps) {
  kiln::assign(y_fused, make(), exec);
  kiln::assign<kiln::stance::force_eager>(y_eager, make(), exec);
  std::vector<double> tf, te;
  for (int r = 0; r < reps; ++r) {
    tf.push_back(seconds([&] { kiln::assign(y_fused, make(), exec); }));
    te.push_back(seconds([&] { kiln::assign<kiln::stance::force_eager>(y_eager, make(), exec); }));
  }
  return {median(tf), median(te)};
}

// std::memcpy of the N floats, on one thread and split over `threads` (each its own memcpy of a
// contiguous chunk); the machine's copy bandwidth is the better of the two.
struct Copy {
  double one_s, par_s;
};
Copy time_copy(float* dst, const float* src, index_t n, int threads, int reps) {
  auto par = [&] {
#if defined(_OPENMP)
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int k = 0; k < threads; ++k) {
      const index_t b = n * k / threads, e = n * (k + 1) / threads;
      std::memcpy(dst + b, src + b, std::size_t(e - b) * sizeof(float));
    }
#else
    (void)threads;
    std::memcpy(dst, src, std::size_t(n) * sizeof(float));
#endif
  };
  auto one = [&] { std::memcpy(dst, src, std::size_t(n) * sizeof(float)); };
  one();
  par();
  std::vector<double> t1, tp;
  for (int r = 0; r < reps; ++r) {
    t1.push_back(seconds(one));
    tp.push_back(seconds(par));
  }
  return {median(t1), median(tp)};
}

template <int K>
void run_cheap(kiln::CpuExecutor& exec, const Options& o, const Vec& x, Vec& yf, Vec& ye, double copy_gbps) {
  const Timing t = time_pair(exec, yf, ye, [&] { return chain<K>(x); }, o.reps);
  const double diff = max_abs_diff(yf, ye);
  if (diff > 1e-5) std::fprintf(stderr, "fusion: k=%d fused and eager differ by %g\n", K, diff);
  const double bytes = 8.0 * double(o.n);
  const double fused_gbps = bytes / t.fused_s * 1e-9;
  std::printf(
      "{\"bench\":\"fusion\",\"backend\":\"cpu\",\"threads\":%d,\"k\":%d,\"n\":%lld,\"fused_s\":%.6g,"
      "\"eager_s\":%.6g,\"fused_over_eager\":%.4g,\"fused_gbps\":%.4g,\"copy_gbps\":%.4g,\"frac_of_copy\":%.4g}\n",
      exec.threads(), K, static_cast<long long>(o.n), t.fused_s, t.eager_s, t.eager_s / t.fused_s, fused_gbps,
      copy_gbps, fused_gbps / copy_gbps);
  std::fflush(stdout);
}

template <int... K>
void run_all_cheap(kiln::CpuExecutor& exec, const Options& o, const Vec& x, Vec& yf, Vec& ye, double copy_gbps,
                   std::integer_sequence<int, K...>) {
  (run_cheap<K + 1>(exec, o, x, yf, ye, copy_gbps), ...);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  kiln::CpuExecutor exec(o.threads);
  std::vector<std::string> peer;
  if (o.python != "none") {
    peer = kiln_bench::peer_lines(o.python, "torch_fusion.py",
                                  "--n " + std::to_string(o.n) + " --threads " + std::to_string(exec.threads()) +
                                      " --reps " + std::to_string(o.reps));
    if (peer.empty())
      peer.push_back("{\"bench\":\"fusion_transcendental_torch\",\"skipped\":\"" + o.python + " printed nothing\"}");
  }
  Vec x(o.n), yf(o.n), ye(o.n);
  // Touch every page before timing anything (first-touch faults are not bandwidth), in
  // parallel like the kernels so pages land near the threads that use them.
  kiln::assign(x, 0.0f, exec);
  kiln::assign(yf, 0.0f, exec);
  kiln::assign(ye, 0.0f, exec);
  for (index_t i = 0; i < o.n; ++i) x.data()[i] = float(std::sin(double(i) * 0.001));  // in [-1, 1]

  const Copy c = time_copy(yf.data(), x.data(), o.n, exec.threads(), o.reps);
  const double bytes = 8.0 * double(o.n);
  const double copy_gbps = bytes / std::min(c.one_s, c.par_s) * 1e-9;
  std::printf(
      "{\"bench\":\"fusion_copy\",\"backend\":\"cpu\",\"threads\":%d,\"n\":%lld,\"copy_1t_s\":%.6g,"
      "\"copy_1t_gbps\":%.4g,\"copy_mt_s\":%.6g,\"copy_mt_gbps\":%.4g,\"copy_gbps\":%.4g}\n",
      exec.threads(), static_cast<long long>(o.n), c.one_s, bytes / c.one_s * 1e-9, c.par_s,
      bytes / c.par_s * 1e-9, copy_gbps);

  run_all_cheap(exec, o, x, yf, ye, copy_gbps, std::make_integer_sequence<int, 8>{});

  const Timing t = time_pair(exec, yf, ye, [&] { return transcendental(x); }, o.reps);
  const double diff = max_abs_diff(yf, ye);
  if (diff > 1e-5) std::fprintf(stderr, "fusion: transcendental fused and eager differ by %g\n", diff);
  std::printf(
      "{\"bench\":\"fusion_transcendental\",\"backend\":\"cpu\",\"threads\":%d,\"k\":3,\"n\":%lld,"
      "\"fused_s\":%.6g,\"eager_s\":%.6g,\"fused_over_eager\":%.4g}\n",
      exec.threads(), static_cast<long long>(o.n), t.fused_s, t.eager_s, t.eager_s / t.fused_s);

  // The peers' times against kiln's fused chain; "null" where a peer gave none.
  std::string eager_s = "null", compiled_s = "null";
  for (const auto& l : peer) {
    std::printf("%s\n", l.c_str());
    if (const auto v = kiln_bench::json_field(l, "torch_eager_s"); !v.empty()) eager_s = v;
    if (const auto v = kiln_bench::json_field(l, "torch_compiled_s"); !v.empty()) compiled_s = v;
  }
  auto ratio = [&](const std::string& s) {
    return s == "null" ? std::string("null") : std::to_string(std::atof(s.c_str()) / t.fused_s);
  };
  if (o.python != "none")
    std::printf(
        "{\"bench\":\"fusion_transcendental_peers\",\"backend\":\"cpu\",\"threads\":%d,\"n\":%lld,"
        "\"kiln_fused_s\":%.6g,\"torch_eager_s\":%s,\"torch_compiled_s\":%s,\"torch_eager_over_kiln_fused\":%s,"
        "\"torch_compiled_over_kiln_fused\":%s}\n",
        exec.threads(), static_cast<long long>(o.n), t.fused_s, eager_s.c_str(), compiled_s.c_str(),
        ratio(eager_s).c_str(), ratio(compiled_s).c_str());
  return 0;
}

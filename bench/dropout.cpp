// bench/dropout.cpp — the claim: dropout's forward + backward costs at most half of what it did
// when every element computed a whole Philox4x32 block, kept one of its four words, and the
// backward computed it again (issue 16, item 6).
//
// Three algorithms over the same [rows, cols] float32 input, on ONE CpuExecutor thread, in the
// same run, repetitions interleaved so that a slow moment of the machine hits all alike:
//   old:        the kernels as they were (a copy below): one Philox block per element, the
//               backward regenerating the mask;
//   mask:       kiln's kernels (kiln/nn/dropout.hpp) with the forward storing the bit-packed mask
//               (its buffer allocated every forward, as nn::dropout does) and the backward reading it;
//   regenerate: kiln's kernels with the backward drawing the mask again (all four words of every
//               block, vectorised tiles), no mask stored.
// The outputs of all three are checked to be bit-identical. `new_over_old` is the forward +
// backward median of what nn::dropout uses (detail::dropout_stores_mask) over old's.
// A last line gives the keep rate measured over [1024, 1024] against 1 − p.
//
// Output: one JSON line per measurement. Flags: --reps R (default 101, at least 3), --p P
// (default 0.5), --offset O (default 3: not a multiple of 4, so the first and last Philox block
// are partial).
#include <kiln.hpp>
#include <kiln/nn/dropout.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#include "timing.hpp"

namespace {

using kiln::index_t;
using Vec = kiln::Tensor<float, kiln::host, kiln::dyn>;
using Mask = kiln::Tensor<std::uint8_t, kiln::host, kiln::dyn>;

struct Options {
  int reps = 101;
  double p = 0.5;
  std::uint64_t offset = 3;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dropout: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--reps") o.reps = std::atoi(value());
    else if (a == "--p") o.p = std::atof(value());
    else if (a == "--offset") o.offset = std::strtoull(value(), nullptr, 10);
    else {
      std::fprintf(stderr, "usage: dropout [--reps R] [--p P] [--offset O]\n");
      std::exit(2);
    }
  }
  if (o.reps < 3 || !(o.p >= 0.0 && o.p < 1.0)) {
    std::fprintf(stderr, "dropout: need --reps >= 3 and 0 <= --p < 1\n");
    std::exit(2);
  }
  return o;
}

using kiln_bench::median;

using kiln_bench::seconds;

// ---- the baseline: dropout's kernels before issue 16 (one Philox block per element) ----------
struct OldForward {
  const float* x;
  float* y;
  std::uint64_t seed, offset;
  float p;
  float scale;
  void operator()(index_t, index_t i) const {
    y[i] = kiln::nn::dropout_keeps(seed, offset, i, p) ? float(x[i] * scale) : 0.0f;
  }
};
struct OldBackward {
  float* dx;
  const float* g;
  std::uint64_t seed, offset;
  float p;
  float scale;
  bool add;
  void operator()(index_t, index_t i) const {
    const float v = kiln::nn::dropout_keeps(seed, offset, i, p) ? float(g[i] * scale) : 0.0f;
    dx[i] = add ? dx[i] + v : v;
  }
};

struct Buffers {
  Vec x, g, y, dx;
  explicit Buffers(index_t n) : x(n), g(n), y(n), dx(n) {}
};

struct Times {
  std::vector<double> fwd, bwd;
  void add(double f, double b) {
    fwd.push_back(f);
    bwd.push_back(b);
  }
};

bool same(const Vec& a, const Vec& b) {
  return std::memcmp(a.data(), b.data(), std::size_t(a.size()) * sizeof(float)) == 0;
}

void run_size(kiln::CpuExecutor& exec, const Options& o, index_t rows, index_t cols) {
  const index_t n = rows * cols;
  const std::uint64_t seed = 0x5eed;
  const float pf = float(o.p);
  const float scale = float(1.0 / (1.0 - o.p));
  Buffers old_b(n), mask_b(n), regen_b(n);
  for (Buffers* b : {&old_b, &mask_b, &regen_b})
    for (index_t i = 0; i < n; ++i) {
      b->x.data()[i] = float(std::sin(double(i) * 0.001)) + 1.5f;  // never 0
      b->g.data()[i] = float(std::cos(double(i) * 0.003)) + 1.5f;
    }
  const auto draw = kiln::nn::detail::DropoutDraw::make(seed, o.offset, n, pf);
  const std::size_t bytes = std::size_t(n) * sizeof(float) * 2;

  auto old_step = [&](Times& t) {
    const double f = seconds([&] {
      exec.for_each_element(1, n, OldForward{old_b.x.data(), old_b.y.data(), seed, o.offset, pf, scale},
                            kiln::kind::elementwise, "dropout", bytes);
    });
    const double b = seconds([&] {
      exec.for_each_element(1, n, OldBackward{old_b.dx.data(), old_b.g.data(), seed, o.offset, pf, scale, false},
                            kiln::kind::elementwise, "dropout_backward", bytes);
    });
    t.add(f, b);
  };
  std::shared_ptr<Mask> mask;
  auto mask_step = [&](Times& t) {
    const double f = seconds([&] {
      mask = std::make_shared<Mask>(draw.items());  // as nn::dropout allocates it
      kiln::nn::detail::launch_dropout(
          exec, kiln::nn::detail::DropoutForward<float>{draw, mask_b.x.data(), mask_b.y.data(), mask->data(), scale},
          "dropout", bytes);
    });
    const double b = seconds([&] {
      kiln::nn::detail::launch_dropout(exec,
                                       kiln::nn::detail::DropoutBackward<float>{draw, mask_b.dx.data(), mask_b.g.data(),
                                                                                mask->data(), scale, false},
                                       "dropout_backward", bytes);
    });
    t.add(f, b);
  };
  auto regen_step = [&](Times& t) {
    const double f = seconds([&] {
      kiln::nn::detail::launch_dropout(
          exec, kiln::nn::detail::DropoutForward<float>{draw, regen_b.x.data(), regen_b.y.data(), nullptr, scale},
          "dropout", bytes);
    });
    const double b = seconds([&] {
      kiln::nn::detail::launch_dropout(exec,
                                       kiln::nn::detail::DropoutBackward<float>{draw, regen_b.dx.data(),
                                                                                regen_b.g.data(), nullptr, scale, false},
                                       "dropout_backward", bytes);
    });
    t.add(f, b);
  };

  Times warm, t_old, t_mask, t_regen;
  old_step(warm);
  mask_step(warm);
  regen_step(warm);
  const bool ok = same(old_b.y, mask_b.y) && same(old_b.y, regen_b.y) && same(old_b.dx, mask_b.dx) &&
                  same(old_b.dx, regen_b.dx);
  if (!ok) std::fprintf(stderr, "dropout: [%lld, %lld] the algorithms disagree\n", (long long)rows, (long long)cols);
  for (int r = 0; r < o.reps; ++r) {
    old_step(t_old);
    mask_step(t_mask);
    regen_step(t_regen);
  }
  auto total = [](const Times& t) {
    std::vector<double> s(t.fwd.size());
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = t.fwd[i] + t.bwd[i];
    return median(s);
  };
  const double old_s = total(t_old), mask_s = total(t_mask), regen_s = total(t_regen);
  const char* chosen = kiln::nn::detail::dropout_stores_mask ? "mask" : "regenerate";
  const double new_s = kiln::nn::detail::dropout_stores_mask ? mask_s : regen_s;
  std::printf(
      "{\"bench\":\"dropout\",\"backend\":\"cpu\",\"threads\":%d,\"rows\":%lld,\"cols\":%lld,\"p\":%g,"
      "\"offset\":%llu,\"reps\":%d,\"identical\":%s,"
      "\"old_fwd_s\":%.6g,\"old_bwd_s\":%.6g,\"old_s\":%.6g,"
      "\"mask_fwd_s\":%.6g,\"mask_bwd_s\":%.6g,\"mask_s\":%.6g,"
      "\"regen_fwd_s\":%.6g,\"regen_bwd_s\":%.6g,\"regen_s\":%.6g,"
      "\"chosen\":\"%s\",\"new_over_old\":%.4g,\"mask_over_regen\":%.4g}\n",
      exec.threads(), (long long)rows, (long long)cols, o.p, (unsigned long long)o.offset, o.reps,
      ok ? "true" : "false", median(t_old.fwd), median(t_old.bwd), old_s, median(t_mask.fwd), median(t_mask.bwd),
      mask_s, median(t_regen.fwd), median(t_regen.bwd), regen_s, chosen, new_s / old_s, mask_s / regen_s);
  std::fflush(stdout);
}

// The share of kept elements over [1024, 1024] through nn::dropout's stored mask, against 1 − p.
void keep_rate(kiln::CpuExecutor& exec, const Options& o) {
  const index_t n = index_t(1024) * 1024;
  Vec x(n), y(n);
  for (index_t i = 0; i < n; ++i) x.data()[i] = 1.0f;
  const auto draw = kiln::nn::detail::DropoutDraw::make(0x5eed, o.offset, n, float(o.p));
  Mask mask(draw.items());
  kiln::nn::detail::launch_dropout(
      exec, kiln::nn::detail::DropoutForward<float>{draw, x.data(), y.data(), mask.data(), 1.0f}, "dropout", 0);
  std::uint64_t kept_bits = 0, kept_values = 0;
  for (index_t j = 0; j < mask.size(); ++j) kept_bits += std::uint64_t(std::popcount(unsigned(mask.data()[j])));
  for (index_t i = 0; i < n; ++i) kept_values += y.data()[i] != 0.0f;
  const double rate = double(kept_bits) / double(n), want = 1.0 - o.p;
  std::printf(
      "{\"bench\":\"dropout_keep_rate\",\"backend\":\"cpu\",\"n\":%lld,\"p\":%g,\"keep_rate\":%.6f,"
      "\"expected\":%.6f,\"rel_err\":%.3g,\"mask_agrees_with_output\":%s}\n",
      (long long)n, o.p, rate, want, (rate - want) / want, kept_bits == kept_values ? "true" : "false");
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  kiln::CpuExecutor exec(1);
  run_size(exec, o, 64, 256);
  run_size(exec, o, 1024, 1024);
  keep_rate(exec, o);
  return 0;
}

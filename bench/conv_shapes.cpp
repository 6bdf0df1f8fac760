// bench/conv_shapes — kiln's CPU convolution kernels on every convolution shape of ResNet-9 (32x32),
// ResNet-18 and ResNet-50 (--size, 224 by default), forward, backward-data and backward-filter,
// side by side with PyTorch's own convolution on the same shapes (bench/torch_conv_shapes.py:
// aten's convolution and convolution_backward, i.e. oneDNN, channels_last and contiguous) run in
// the same process tree before kiln's runs, with the same --threads. It says where a convnet's
// step loses time to the peer, shape by shape, and what a model's convolutions cost in all.
//
// Output, JSON lines: the peer's lines first (versions, then one per shape, op and memory format);
// then per model, shape, op and layout kiln's line
//   bench, model, size, batch, threads, layout, op ("forward", "backward_data", "backward_filter"),
//   c_in, hw, c_out, k, stride, count (that shape's convolutions per step), kiln_ms, gflops,
//   peer ("torch_channels_last" for nhwc, "torch_contiguous" for nchw), peer_ms, speedup
//   (peer_ms / kiln_ms);
// and per model, op and layout a total: kiln_total_ms and peer_total_ms (sum of count x ms),
// speedup. The stem's backward-data is left out (a training step does not compute it).
// Medians over --seconds of repetitions per measurement after one warm-up.
//
//   build/bench/conv_shapes [--threads 1] [--batch 8] [--size 224] [--models resnet9_w32,resnet50]
//                           [--layouts nhwc,nchw] [--ops forward,backward_data,backward_filter]
//                           [--seconds 0.5] [--python PY|none]
// ResNet-9 always runs at 32x32 (its type fixes it); --size sets ResNet-18's and ResNet-50's.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/backend/cpu/conv2d.hpp"
#include "kiln/backend/cpu/conv2d_nhwc.hpp"
#include "kiln/core/random.hpp"

#include "conv_shapes.hpp"
#include "mlp_step.hpp"

namespace {

using kiln::index_t;
using kiln_bench::ConvRow;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

kiln::cpu::Conv2dShape shape_of(const ConvRow& r, index_t batch) {
  return {.n = batch, .c_in = r.c_in, .h = r.hw, .w = r.hw, .c_out = r.c_out, .kh = r.k, .kw = r.k,
          .stride_h = r.stride, .stride_w = r.stride, .pad_h = r.pad, .pad_w = r.pad};
}

// Median milliseconds of f() over `seconds` (at least 3 runs) after one warm-up run.
template <class F>
double median_ms(double seconds, const F& f) {
  f();
  std::vector<double> times;
  double spent = 0;
  while (times.size() < 3 || (times.size() < 200 && spent < seconds)) {
    const double s = kiln_bench::seconds(f);
    spent += s;
    times.push_back(s * 1e3);
  }
  return kiln_bench::median(times);
}

double kiln_ms(const ConvRow& r, index_t batch, bool nhwc, const std::string& op, int threads, double seconds) {
  const kiln::cpu::Conv2dShape s = shape_of(r, batch);
  const index_t oh = s.out_h(), ow = s.out_w();
  std::vector<float> x(std::size_t(batch * r.c_in * r.hw * r.hw)), w(std::size_t(r.c_out * r.c_in * r.k * r.k)),
      y(std::size_t(batch * r.c_out * oh * ow));
  kiln::Generator gen(1);
  for (auto* v : {&x, &w, &y})
    for (float& e : *v) e = gen.uniform(-1.f, 1.f);
  if (op == "forward")
    return median_ms(seconds, [&] {
      if (nhwc) kiln::cpu::conv2d_nhwc_forward<float>(s, x.data(), w.data(), nullptr, y.data(), threads);
      else kiln::cpu::conv2d_forward<float>(s, x.data(), w.data(), nullptr, y.data(), threads);
    });
  if (op == "backward_data")
    return median_ms(seconds, [&] {
      if (nhwc) kiln::cpu::conv2d_nhwc_backward_data<float>(s, y.data(), w.data(), x.data(), threads);
      else kiln::cpu::conv2d_backward_data<float>(s, y.data(), w.data(), x.data(), threads);
    });
  return median_ms(seconds, [&] {
    if (nhwc) kiln::cpu::conv2d_nhwc_backward_filter<float>(s, x.data(), y.data(), w.data(), nullptr, threads);
    else kiln::cpu::conv2d_backward_filter<float>(s, x.data(), y.data(), w.data(), nullptr, threads);
  });
}

// The peer's rows on its command line: c_in,hw,c_out,k,stride,pad,count;...
std::string rows_arg(const std::vector<ConvRow>& rows) {
  std::string out;
  for (const auto& r : rows)
    out += (out.empty() ? "" : ";") + std::to_string(r.c_in) + "," + std::to_string(r.hw) + "," +
           std::to_string(r.c_out) + "," + std::to_string(r.k) + "," + std::to_string(r.stride) + "," +
           std::to_string(r.pad) + "," + std::to_string(r.count);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, size = 224;
  long batch = 8;
  double seconds = 0.5;
  std::string models = "resnet9_w32,resnet50", layouts = "nhwc,nchw", ops = "forward,backward_data,backward_filter",
              python = kiln_bench::default_python();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--batch") batch = std::atol(argv[i + 1]);
    else if (a == "--size") size = std::atoi(argv[i + 1]);
    else if (a == "--models") models = argv[i + 1];
    else if (a == "--layouts") layouts = argv[i + 1];
    else if (a == "--ops") ops = argv[i + 1];
    else if (a == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (a == "--python") python = argv[i + 1];
    else {
      std::fprintf(stderr, "conv_shapes: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  for (const std::string& model : split(models)) {
    if (model != "resnet9_w32" && model != "resnet18" && model != "resnet50") {
      std::fprintf(stderr, "conv_shapes: unknown model %s (have resnet9_w32, resnet18, resnet50)\n", model.c_str());
      return 2;
    }
    const int model_size = model == "resnet9_w32" ? 32 : size;
    const std::vector<ConvRow> rows = kiln_bench::conv_rows(model, model_size);
    // (row, op, memory format) -> the peer's median ms
    std::map<std::tuple<std::size_t, std::string, std::string>, double> peer;
    if (python != "none") {
      const std::string args = "--threads " + std::to_string(threads) + " --batch " + std::to_string(batch) +
                               " --seconds " + std::to_string(seconds) + " --ops " + ops + " --rows '" +
                               rows_arg(rows) + "'";
      const auto lines = kiln_bench::peer_lines(python, "torch_conv_shapes.py", args);
      if (lines.empty())
        std::printf("{\"bench\": \"conv_shapes\", \"peer\": \"torch\", \"skipped\": \"%s printed nothing\"}\n",
                    python.c_str());
      for (const auto& l : lines) {
        std::printf("%s\n", l.c_str());
        const std::string ms = kiln_bench::json_field(l, "median_ms");
        if (!ms.empty() && ms != "null")
          peer[{std::size_t(std::atol(kiln_bench::json_field(l, "row").c_str())), kiln_bench::json_field(l, "op"),
                kiln_bench::json_field(l, "peer")}] = std::atof(ms.c_str());
      }
      std::fflush(stdout);
    }
    for (const std::string& op : split(ops))
      for (const std::string& lay : split(layouts)) {
        const bool nhwc = lay == "nhwc";
        const std::string peer_name = nhwc ? "torch_channels_last" : "torch_contiguous";
        double kiln_total = 0, peer_total = 0;
        bool peer_complete = true;
        for (std::size_t i = 0; i < rows.size(); ++i) {
          const ConvRow& r = rows[i];
          if (op == "backward_data" && r.c_in == 3) continue;  // the stem's input needs no gradient
          const double ms = kiln_ms(r, batch, nhwc, op, threads, seconds);
          const kiln::cpu::Conv2dShape s = shape_of(r, batch);
          const double flops = 2.0 * double(batch * s.out_h() * s.out_w() * r.c_out * r.c_in * r.k * r.k);
          kiln_total += ms * r.count;
          std::printf("{\"bench\": \"conv_shapes\", \"model\": \"%s\", \"size\": %d, \"batch\": %ld, \"threads\": %d, "
                      "\"layout\": \"%s\", \"op\": \"%s\", \"c_in\": %ld, \"hw\": %ld, \"c_out\": %ld, \"k\": %ld, "
                      "\"stride\": %ld, \"count\": %d, \"kiln_ms\": %.4f, \"gflops\": %.1f",
                      model.c_str(), model_size, batch, threads, lay.c_str(), op.c_str(), long(r.c_in), long(r.hw),
                      long(r.c_out), long(r.k), long(r.stride), r.count, ms, flops / ms * 1e-6);
          const auto p = peer.find({i, op, peer_name});
          if (p != peer.end()) {
            peer_total += p->second * r.count;
            std::printf(", \"peer\": \"%s\", \"peer_ms\": %.4f, \"speedup\": %.3f", peer_name.c_str(), p->second,
                        p->second / ms);
          } else {
            peer_complete = false;
          }
          std::printf("}\n");
          std::fflush(stdout);
        }
        std::printf("{\"bench\": \"conv_shapes\", \"model\": \"%s\", \"size\": %d, \"batch\": %ld, \"threads\": %d, "
                    "\"layout\": \"%s\", \"op\": \"%s\", \"kiln_total_ms\": %.3f",
                    model.c_str(), model_size, batch, threads, lay.c_str(), op.c_str(), kiln_total);
        if (peer_complete)
          std::printf(", \"peer\": \"%s\", \"peer_total_ms\": %.3f, \"speedup\": %.3f", peer_name.c_str(), peer_total,
                      peer_total / kiln_total);
        std::printf("}\n");
        std::fflush(stdout);
      }
  }
  return 0;
}

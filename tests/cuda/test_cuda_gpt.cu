// The GPT's pieces on CudaExecutor against the CPU executor: causal attention (kiln's own CUDA
// kernels, fp64 to rounding and fp32, with dropout's mask), the token and position embeddings
// (and a bad id's NaN row), and a whole GPT's logits, loss and every gradient from the same seed,
// in fp32 and under bf16_mixed; AdamW's group without weight decay (nanoGPT's rule) and the gradient
// clipping a captured step can hold, on the device.
//
// Tolerances: in fp64 the two attention kernels sum in other orders (the device's online softmax
// rescales per key, the CPU's per tile of 64), so they agree to rounding, 1e-12. In fp32 and
// through the GPT (cuBLASLt's GEMMs, CUDA's expf / tanhf) the bound is check_close's 1e-4
// (tests/cuda/support.hpp), the loss 1e-5.
#include <doctest/doctest.h>

#include <kiln/cuda.cuh>
#include <kiln/models/gpt.hpp>
#include <kiln/nn/cuda.cuh>
#include <kiln/optim/cuda_clip.cuh>
#include <kiln/optim/cuda_step.cuh>
#include <kiln/train/loss.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

using kiln_cuda_test::check_close;
using kiln_cuda_test::fetch;
using kiln_cuda_test::to_space;

using kiln::dyn;
using kiln::host;
using kiln::index_t;
using kiln::Shape;
using Cpu = kiln::CpuExecutor;
using Gpu = kiln::CudaExecutor;
using Device = kiln::cuda;
namespace nn = kiln::nn;
namespace ag = kiln::ag;

template <class T>
kiln::Tensor<T, host, dyn, dyn, dyn> random_tensor(Shape s, std::uint32_t seed, double scale = 1.0) {
  kiln::Tensor<T, host, dyn, dyn, dyn> t(s);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = kiln::convert<T>(float(u(rng)));
  return t;
}

// y = attention(x) twice from one qkv (so the second backward accumulates), then the gradient of
// sum(y1·w + y2·w2). Returns y1, x's gradient.
template <class T, class Exec>
std::vector<std::vector<double>> attention_once(Exec& exec, const kiln::Tensor<T, host, dyn, dyn, dyn>& qkv,
                                                const kiln::Tensor<T, host, dyn, dyn, dyn>& w,
                                                const kiln::Tensor<T, host, dyn, dyn, dyn>& w2, index_t heads,
                                                nn::AttentionDropout drop) {
  using S = typename Exec::space;
  ag::Tape<Exec> tape(exec);
  ag::Var<T, S, dyn, dyn, dyn> x(to_space<S>(qkv), true), vw(to_space<S>(w)), vw2(to_space<S>(w2));
  const auto y1 = nn::causal_attention(tape, x, heads, drop);
  const auto y2 = nn::causal_attention(tape, x, heads, {drop.p, drop.seed + 1, drop.offset});
  tape.backward(ag::sum(tape, ag::map(tape, y1 * vw + y2 * vw2)));
  return {fetch(y1.value()), fetch(x.grad())};
}

struct AttentionCase {
  index_t batch, length, heads, head_dim;
  double dropout;
};

template <class T>
void compare_attention(const AttentionCase& c, double tol) {
  CAPTURE(c.length);
  CAPTURE(c.heads);
  CAPTURE(c.head_dim);
  CAPTURE(c.dropout);
  const index_t W = c.heads * c.head_dim;
  const auto qkv = random_tensor<T>(Shape{c.batch, c.length, 3 * W}, 11 + std::uint32_t(c.length), 1.5);
  const auto w = random_tensor<T>(Shape{c.batch, c.length, W}, 12);
  const auto w2 = random_tensor<T>(Shape{c.batch, c.length, W}, 13);
  const nn::AttentionDropout drop{c.dropout, 99, 5};
  Cpu cpu(2);
  Gpu gpu;
  const auto ref = attention_once<T>(cpu, qkv, w, w2, c.heads, drop);
  const auto got = attention_once<T>(gpu, qkv, w, w2, c.heads, drop);
  check_close(got[0], ref[0], tol, "attention output");
  check_close(got[1], ref[1], tol, "attention gradient (accumulated over two calls)");
}

const AttentionCase attention_cases[] = {
    {2, 1, 2, 16, 0.0},    // T = 1: one key per query
    {2, 67, 2, 24, 0.0},   // head width 24 in the 32-wide kernel; T past one block of 64 rows
    {1, 130, 3, 64, 0.0},  // three blocks of queries, the mask inside the last
    {2, 67, 2, 32, 0.2},   // dropout: the CPU's mask drawn again, forward and backward
    {1, 40, 1, 128, 0.0},  // the widest head (tiles of 32 keys in fp32, 16 in fp64)
};

}  // namespace

TEST_CASE("attention on CudaExecutor: kiln's kernel gives the CPU's output and gradients (fp64 to rounding)") {
  for (const auto& c : attention_cases) compare_attention<double>(c, 1e-12);
}

TEST_CASE("attention on CudaExecutor: the same in fp32") {
  for (const auto& c : attention_cases) compare_attention<float>(c, 1e-4);
}

TEST_CASE("attention on CudaExecutor: bf16 storage, float arithmetic, as the CPU's") {
  // Both widen to float and round once per store, in other summation orders: a value on a
  // rounding boundary may land one ulp away (2^-8 relative), twice for the accumulated gradient.
  // (f16 takes the same template path with another storage type.)
  for (const auto& c : attention_cases) compare_attention<kiln::bf16>(c, 3e-2);
}

TEST_CASE("attention on CudaExecutor: a head wider than 128 is refused, naming it") {
  Gpu gpu;
  ag::Tape<Gpu> tape(gpu);
  ag::Var<float, Device, dyn, dyn, dyn> x(kiln::to_device(random_tensor<float>(Shape{1, 4, 3 * 160}, 1)));
  CHECK_THROWS_WITH_AS(nn::causal_attention(tape, x, 1), doctest::Contains("head width 160"), kiln::ShapeError);
}

namespace {

// Embedding then PositionEmbedding on one executor, and the gradient of sum(y·w): y and both tables'
// gradients.
template <class Exec, class Emb, class Pos>
std::vector<std::vector<double>> embed_once(Exec& exec, Emb& emb, Pos& pos, const kiln::Tensor<float, host, dyn, dyn>& ids,
                                            const kiln::Tensor<float, host, dyn, dyn, dyn>& w) {
  using S = typename Exec::space;
  ag::Tape<Exec> tape(exec);
  emb.for_each_parameter([](const auto& v) { v.data()->grad_valid = false; });
  pos.for_each_parameter([](const auto& v) { v.data()->grad_valid = false; });
  ag::Var<float, S, dyn, dyn> x(to_space<S>(ids));
  ag::Var<float, S, dyn, dyn, dyn> vw(to_space<S>(w));
  const auto y = pos.forward(tape, emb.forward(tape, x));
  tape.backward(ag::sum(tape, ag::map(tape, y * vw)));
  return {fetch(y.value()), fetch(emb.weight().grad()), fetch(pos.weight().grad())};
}

}  // namespace

TEST_CASE("embeddings on CudaExecutor: the CPU's rows and gradients; a bad id gives a NaN row, no gradient") {
  using Emb = nn::Embedding<11, 16>;
  using Pos = nn::PositionEmbedding<8, 16>;
  Emb emb_h(3);
  Pos pos_h(4);
  Emb::on<Device> emb_d(3);
  Pos::on<Device> pos_d(4);
  check_close(fetch(emb_d.weight().value()), fetch(emb_h.weight().value()), 0.0, "the same initial table");
  const index_t rows = 3, len = 6;
  kiln::Tensor<float, host, dyn, dyn> ids(Shape{rows, len});
  for (index_t i = 0; i < ids.size(); ++i) ids.data()[i] = float((i * 7) % 11);  // repeats: the scatter adds
  const auto w = random_tensor<float>(Shape{rows, len, 16}, 5);
  Cpu cpu(2);
  Gpu gpu;
  const auto ref = embed_once(cpu, emb_h, pos_h, ids, w);
  const auto got = embed_once(gpu, emb_d, pos_d, ids, w);
  check_close(got[0], ref[0], 0.0, "embedded rows");  // copies and one add: exact
  check_close(got[1], ref[1], 1e-6, "token table gradient");
  check_close(got[2], ref[2], 1e-6, "position table gradient");

  // Bad ids on the device: rows of NaN where the CPU throws (a kernel cannot throw), nothing
  // read outside the table, and no gradient from them.
  ids.data()[2] = 11.0f;
  ids.data()[7] = -1.0f;
  ids.data()[9] = 2.5f;
  const auto bad = embed_once(gpu, emb_d, pos_d, ids, w);
  for (index_t r = 0; r < rows * len; ++r) {
    const bool is_bad = r == 2 || r == 7 || r == 9;
    for (index_t c = 0; c < 16; ++c) CHECK(std::isnan(bad[0][std::size_t(r * 16 + c)]) == is_bad);
  }
  for (double g : bad[1]) CHECK(std::isfinite(g));
}

namespace {

// The llm.c test's tiny GPT (tests/cpu/test_gpt.cpp). (With dropout the device draws the CPU's
// masks: nn::Dropout's in test_cuda_nn.cu, attention's in the dropout case above.)
constexpr kiln::models::GptConfig tiny{.vocab = 65, .block_size = 16, .layers = 2, .heads = 2, .width = 32};

// One forward + cross-entropy + backward: logits, loss, then every parameter's gradient.
template <class Model, class Exec>
std::vector<std::vector<double>> gpt_step(Model& model, Exec& exec, const kiln::Tensor<float, host, dyn, dyn>& ids,
                                          const kiln::Tensor<std::int32_t, host, dyn>& labels) {
  using S = typename Exec::space;
  ag::Tape<Exec> tape(exec);
  model.zero_grad();
  ag::Var<float, S, dyn, dyn> x(to_space<S>(ids));
  const auto lab = to_space<S>(labels);
  const auto logits = model.forward(tape, x);
  const auto loss = kiln::train::CrossEntropy{}(tape, logits, lab.data());
  tape.backward(loss);
  std::vector<std::vector<double>> out{fetch(logits.value()), fetch(loss.value())};
  model.for_each_parameter([&](const auto& v) {
    REQUIRE(v.has_grad());
    out.push_back(fetch(v.grad()));
  });
  return out;
}

template <kiln::models::GptConfig C>
void compare_gpt() {
  using Model = kiln::models::GPT<C>;
  Model cpu_model(7);
  typename Model::template on<Device> gpu_model(7);
  const index_t batch = 4, length = C.block_size;
  kiln::Tensor<float, host, dyn, dyn> ids(Shape{batch, length});
  kiln::Tensor<std::int32_t, host, dyn> labels(Shape{batch * length});
  std::mt19937 rng(21);
  for (index_t i = 0; i < ids.size(); ++i) {
    ids.data()[i] = float(rng() % C.vocab);
    labels.data()[i] = std::int32_t(rng() % C.vocab);
  }
  Cpu cpu(2);
  Gpu gpu;
  const auto ref = gpt_step(cpu_model, cpu, ids, labels);
  const auto got = gpt_step(gpu_model, gpu, ids, labels);
  REQUIRE(got.size() == ref.size());
  check_close(got[0], ref[0], 1e-4, "logits");
  CHECK(got[1][0] == doctest::Approx(ref[1][0]).epsilon(1e-5));
  for (std::size_t k = 2; k < ref.size(); ++k) check_close(got[k], ref[k], 1e-4, "gradient " + std::to_string(k - 2));
}

}  // namespace

TEST_CASE("GPT on CudaExecutor: the CPU's logits, loss and every gradient from the same seed") {
  compare_gpt<tiny>();
}

TEST_CASE("GPT under bf16_mixed on CudaExecutor: the CPU's bf16 step (logits, loss, gradients)") {
  // bf16 activations, float parameters, low copies of the weights and the tied table: the same
  // roundings on both, in other orders, so bf16's tolerance.
  using Model = kiln::models::GPT<tiny>;
  Model cpu_model(7);
  Model::on<Device> gpu_model(7);
  Cpu cpu(2);
  Gpu gpu;
  cpu_model.refresh_low_copies<kiln::bf16>(cpu);
  gpu_model.refresh_low_copies<kiln::bf16>(gpu);
  const index_t batch = 4, length = tiny.block_size;
  kiln::Tensor<kiln::bf16, host, dyn, dyn> ids(Shape{batch, length});
  kiln::Tensor<std::int32_t, host, dyn> labels(Shape{batch * length});
  std::mt19937 rng(22);
  for (index_t i = 0; i < ids.size(); ++i) {
    ids.data()[i] = kiln::bf16(float(rng() % tiny.vocab));
    labels.data()[i] = std::int32_t(rng() % tiny.vocab);
  }
  auto step = [&](auto& model, auto& exec) {
    using Exec = std::remove_reference_t<decltype(exec)>;
    using S = typename Exec::space;
    ag::Tape<Exec> tape(exec);
    model.zero_grad();
    ag::Var<kiln::bf16, S, dyn, dyn> x(to_space<S>(ids));
    const auto lab = to_space<S>(labels);
    const auto logits = model.forward(tape, x);
    const auto loss = kiln::train::CrossEntropy{}(tape, logits, lab.data());
    tape.backward(loss);
    std::vector<std::vector<double>> out{fetch(logits.value()), fetch(loss.value())};
    model.for_each_parameter([&](const auto& v) { out.push_back(fetch(v.grad())); });
    return out;
  };
  const auto ref = step(cpu_model, cpu);
  const auto got = step(gpu_model, gpu);
  REQUIRE(got.size() == ref.size());
  check_close(got[0], ref[0], 3e-2, "bf16 logits");
  CHECK(got[1][0] == doctest::Approx(ref[1][0]).epsilon(1e-2));
  for (std::size_t k = 2; k < ref.size(); ++k) check_close(got[k], ref[k], 5e-2, "bf16 gradient " + std::to_string(k - 2));
}

namespace {

// Three AdamW steps (fused, or force_eager) of two parameters with fixed gradients, the second in
// the group without weight decay when `groups`. Returns both parameters' values.
template <class Exec>
std::vector<double> adamw_groups(bool eager, bool groups) {
  using S = typename Exec::space;
  kiln::Tensor<float, host, dyn> p0(Shape{5}), g0(Shape{5});
  const float pv[] = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f}, gv[] = {0.1f, -0.2f, 0.3f, 0.0f, -0.05f};
  for (int i = 0; i < 5; ++i) {
    p0.data()[i] = pv[i];
    g0.data()[i] = gv[i];
  }
  auto p1 = to_space<S>(p0), g1 = to_space<S>(g0), p2 = to_space<S>(p0), g2 = to_space<S>(g0);
  kiln::optim::ParamTable table;
  table.add(p1.data(), g1.data(), 5);
  const index_t second = table.add(p2.data(), g2.data(), 5);
  if (groups) table.exclude_from_decay(second);
  kiln::optim::AdamW<S> opt(table, {.lr = 0.1, .weight_decay = 0.5});
  Exec exec;
  for (int step = 0; step < 3; ++step) {
    if (eager) opt.template step<kiln::stance::force_eager>(exec);
    else opt.step(exec);
  }
  auto out = fetch(p1);
  for (double v : fetch(p2)) out.push_back(v);
  return out;
}

}  // namespace

TEST_CASE("AdamW on CudaExecutor: the group without weight decay, as the CPU's (fused and force_eager)") {
  const auto ref = adamw_groups<Cpu>(false, true);
  const auto plain = adamw_groups<Cpu>(false, false);
  CHECK(ref[7] != plain[7]);  // the groups change the second parameter (the comparison can fail)
  check_close(adamw_groups<Gpu>(false, true), ref, 1e-6, "fused");
  check_close(adamw_groups<Gpu>(true, true), ref, 1e-6, "force_eager");
}

TEST_CASE("gradient clipping without a host wait: the gradients cuda_clip_grad_norm gives, clipping or not") {
  kiln::Tensor<float, host, dyn> g0(Shape{3000});
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  for (index_t i = 0; i < g0.size(); ++i) g0.data()[i] = u(rng);  // norm about 3.2
  for (const double max_norm : {1.0, 100.0}) {
    CAPTURE(max_norm);
    auto p = kiln::to_device(g0), ga = kiln::to_device(g0), gb = kiln::to_device(g0);
    kiln::optim::ParamTable ta, tb;
    ta.add(p.data(), ga.data(), 1000);
    ta.add(p.data() + 1000, ga.data() + 1000, 2000);
    tb.add(p.data(), gb.data(), 1000);
    tb.add(p.data() + 1000, gb.data() + 1000, 2000);
    const kiln::optim::CudaParamTable da(ta), db(tb);
    Gpu gpu;
    const double norm = kiln::optim::cuda_clip_grad_norm(da, max_norm, gpu);
    CHECK(norm > 2.0);
    kiln::optim::cuda_clip_grad_norm_on_device(db, max_norm, gpu);
    const auto a = fetch(ga), b = fetch(gb);
    check_close(b, a, 1e-6, "clipped gradients");
    CHECK((a[0] == fetch(kiln::to_device(g0))[0]) == (max_norm > norm));  // clipped only past max_norm
  }
}

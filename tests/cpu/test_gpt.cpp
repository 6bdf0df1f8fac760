// A GPT in llm.c's manner (test_gpt2.c): tests/fixtures/golden_gpt.safetensors (scripts/golden_gpt.py,
// PyTorch float32) holds a tiny GPT's initial weights under nanoGPT's state-dict names, a batch, the
// logits, the loss, every parameter's gradient and the losses of 10 AdamW steps with clipping.
// kiln loads the weights by name and matches each within 1e-5 of the tensor's largest magnitude
// (llm.c allows 1e-2 for logits and 2e-2 for gradients). Also the model's names, tied head,
// parameter groups, and the text pieces: tokenizer, split, windows, and their errors.
#include <kiln.hpp>
#include <kiln/data/text.hpp>
#include <kiln/io/safetensors.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/models/gpt_sample.hpp>
#include <kiln/optim/adam.hpp>
#include <kiln/optim/clip.hpp>
#include <kiln/optim/sgd.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/step.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

using namespace kiln;

namespace {

constexpr models::GptConfig tiny{.vocab = 65, .block_size = 16, .layers = 2, .heads = 2, .width = 32};
using Tiny = models::GPT<tiny>;
constexpr index_t batch = 4, length = 16;

const std::string& fixture_path() {
  static const std::string p = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/golden_gpt.safetensors";
  return p;
}
const io::SafetensorsFile& fixture() {
  static const io::SafetensorsFile f = io::SafetensorsFile::open(fixture_path());
  return f;
}
std::vector<float> floats(const std::string& name) {
  const auto& info = fixture().info(name);
  std::vector<float> v(info.elements());
  fixture().read(name, dtype::f32, info.shape, v.data());
  return v;
}
std::vector<std::int32_t> ints(const std::string& name) {
  const auto& info = fixture().info(name);
  std::vector<std::int32_t> v(info.elements());
  fixture().read(name, dtype::i32, info.shape, v.data());
  return v;
}

// max |a - ref| / max |ref|: llm.c's comparison made relative to the tensor's scale.
double relative_error(const float* a, const std::vector<float>& ref) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - double(ref[i])));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  return worst / std::max(scale, 1e-30);
}

ag::Var<float, host, dyn, length> input() {
  ag::Var<float, host, dyn, length> x(Tensor<float, host, dyn, length>(Shape{batch, length}));
  const auto v = floats("ref.x");
  std::copy(v.begin(), v.end(), x.value().data());
  return x;
}

Tiny loaded() {
  Tiny model(/*seed=*/1);
  const auto result = train::load_weights(fixture_path(), model, {.skip = {"ref."}});
  REQUIRE(result.missing.empty());
  REQUIRE(result.unexpected.empty());
  return model;
}

}  // namespace

TEST_CASE("GPT: nanoGPT's state-dict names, the tied head, the parameter groups") {
  Tiny model(0);
  std::vector<std::string> names;
  io::for_each_state(model, [&](const std::string& name, auto&, io::state_kind) { names.push_back(name); });
  // The file's names (PyTorch's state_dict order) are the model's, in the same order.
  std::vector<std::string> file_names;
  for (const auto& t : fixture().tensors())
    if (!t.name.starts_with("ref.")) file_names.push_back(t.name);
  std::vector<std::string> sorted_names = names, sorted_file = file_names;
  std::sort(sorted_names.begin(), sorted_names.end());
  std::sort(sorted_file.begin(), sorted_file.end());
  CHECK(sorted_names == sorted_file);
  CHECK(names.front() == "transformer.wte.weight");
  CHECK(names.back() == "lm_head.weight");
  CHECK(std::find(names.begin(), names.end(), "transformer.h.1.attn.c_attn.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "transformer.h.0.mlp.c_proj.bias") != names.end());
  // Tied: one parameter (listed once), the head reading the embedding's table.
  CHECK(model.layer<1>().weight().data() == model.token_embedding().weight().data());
  index_t tensors = 0;
  model.for_each_parameter([&](const auto&) { ++tensors; });
  CHECK(tensors == index_t(names.size()) - 1);
  CHECK(model.parameter_count() == 2080 + 512 + 2 * (64 + 3072 + 96 + 1024 + 32 + 64 + 4096 + 128 + 4096 + 32) + 64);
  // Groups: the 2-D projections decay; embeddings, biases and LayerNorms do not.
  const auto table = model.param_table();
  index_t decaying = 0;
  for (index_t k = 0; k < table.count(); ++k) decaying += table[k].decays ? 1 : 0;
  CHECK(decaying == 2 * 4);  // c_attn, attn.c_proj, c_fc, mlp.c_proj per block
  CHECK_FALSE(table[0].decays);  // wte
  // GPT-2's initialisation: N(0, 0.02) weights, N(0, 0.02 / sqrt(2 * layers)) residual projections.
  auto stddev = [](const auto& v) {
    double s = 0;
    for (index_t i = 0; i < v.value().size(); ++i) s += double(v.value().data()[i]) * v.value().data()[i];
    return std::sqrt(s / double(v.value().size()));
  };
  const auto& block0 = model.transformer().layer<2>().first();
  CHECK(stddev(block0.layer<3>().layer<0>().weight()) == doctest::Approx(0.02).epsilon(0.05));
  CHECK(stddev(block0.layer<3>().layer<2>().weight()) == doctest::Approx(0.01).epsilon(0.05));
  CHECK(stddev(block0.layer<3>().layer<0>().bias()) == 0.0);
}

TEST_CASE("GPT: logits, loss and every gradient within 1e-5 of PyTorch's (llm.c's test)") {
  Tiny model = loaded();
  CpuExecutor exec(2);
  ag::Tape<CpuExecutor> tape(exec);
  const auto logits = model.forward(tape, input());
  REQUIRE(logits.shape() == Shape{batch, length, 65});
  const double logit_error = relative_error(logits.value().data(), floats("ref.logits"));
  MESSAGE("logits: largest difference ", logit_error, " of the largest |logit|");
  CHECK(logit_error < 1e-5);
  const auto labels = ints("ref.y");
  const auto loss = train::CrossEntropy{}(tape, logits, labels.data());
  CHECK(loss.item() == doctest::Approx(floats("ref.loss")[0]).epsilon(1e-6));
  tape.backward(loss);
  double worst = 0;
  std::string worst_name;
  index_t compared = 0;
  io::for_each_state(model, [&](const std::string& name, auto& item, io::state_kind) {
    if constexpr (requires { item.grad(); }) {
      if (name == "lm_head.weight") return;  // the tied table: compared as transformer.wte.weight
      REQUIRE(item.has_grad());
      const double e = relative_error(item.grad().data(), floats("ref.grad." + name));
      if (e > worst) {
        worst = e;
        worst_name = name;
      }
      ++compared;
    }
  });
  MESSAGE("gradients: largest difference ", worst, " of the tensor's largest |gradient| (", worst_name, ")");
  CHECK(compared == 2 + 2 * 12 + 2);
  CHECK(worst < 1e-5);

  // The comparison catches a gradient 0.1% off at one element (the test's power, llm.c's 2e-2 would not).
  const auto ref = floats("ref.grad.transformer.h.1.mlp.c_fc.weight");
  std::vector<float> perturbed = ref;
  const auto at = std::size_t(std::max_element(ref.begin(), ref.end(), [](float a, float b) { return std::abs(a) < std::abs(b); }) - ref.begin());
  perturbed[at] *= 1.001f;
  CHECK(relative_error(perturbed.data(), ref) > 1e-5);
}

TEST_CASE("GPT: 10 AdamW steps (groups, clipping) lose what PyTorch's lose") {
  Tiny model = loaded();
  CpuExecutor exec(2);
  optim::AdamW opt(model, {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1});
  train::StepOptions options;
  options.after_backward = [&](index_t) { optim::clip_grad_norm(opt.table(), 1.0, exec); };
  train::Step step(model, opt, exec, kiln::policy<>{}, train::CrossEntropy{}, options);
  const auto x = floats("ref.x");
  const auto y = ints("ref.y");
  const auto want = floats("ref.losses");
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float l = step.run(x.data(), y.data(), batch, length).item();
    worst = std::max(worst, std::abs(double(l) - want[i]) / std::abs(double(want[i])));
  }
  MESSAGE("10 steps: largest relative loss difference ", worst, " (PyTorch's last loss ", want.back(), ")");
  CHECK(worst < 1e-5);
}

TEST_CASE("GPT: reduce_overhead replays the whole step, bit for bit, with B * T labels per batch") {
  const auto x = floats("ref.x");
  const auto y = ints("ref.y");
  auto losses = [&](auto policy) {
    Tiny model = loaded();
    CpuExecutor exec(2);
    optim::AdamW opt(model, {.lr = 1e-2, .beta2 = 0.99, .weight_decay = 0.1});
    train::Step step(model, opt, exec, policy);
    std::vector<float> out;
    for (int i = 0; i < 5; ++i) out.push_back(step.run(x.data(), y.data(), batch, length).item());
    if constexpr (decltype(step)::captures) CHECK(step.captures_made().counts().replays == 4);
    return out;
  };
  const auto eager = losses(kiln::policy<>{});
  const auto replayed = losses(kiln::policy<kiln::mode::reduce_overhead>{});
  CHECK(eager == replayed);
}

TEST_CASE("GPT: two accumulated micro-batches of 2 rows step as one batch of 4") {
  const auto x = floats("ref.x");
  const auto y = ints("ref.y");
  auto after_one_step = [&](auto policy, index_t rows) {
    Tiny model = loaded();
    CpuExecutor exec(1);
    optim::SGD opt(model, {.lr = 0.1});
    train::Step step(model, opt, exec, policy);
    for (index_t r = 0; r < batch; r += rows) (void)step.run(x.data() + r * length, y.data() + r * length, rows, length);
    std::vector<float> values;
    model.for_each_parameter([&](const auto& v) { values.insert(values.end(), v.value().data(), v.value().data() + v.value().size()); });
    return values;
  };
  const auto whole = after_one_step(kiln::policy<>{}, batch);
  const auto accumulated = after_one_step(kiln::policy<kiln::accumulate<2>>{}, batch / 2);
  REQUIRE(whole.size() == accumulated.size());
  double worst = 0;
  for (std::size_t i = 0; i < whole.size(); ++i) worst = std::max(worst, double(std::abs(whole[i] - accumulated[i])));
  CHECK(worst < 1e-6);
  CHECK(whole != after_one_step(kiln::policy<>{}, batch / 2));  // not the same as two steps
}

TEST_CASE("GPT: generation with the key/value cache draws nanoGPT's loop's tokens") {
  Tiny model = loaded();
  CpuExecutor exec(1);
  const std::vector<std::int32_t> prompt{1, 2, 3};
  for (const models::SampleOptions o : {models::SampleOptions{.temperature = 1.0, .top_k = 0, .seed = 3},
                                        models::SampleOptions{.temperature = 0.8, .top_k = 5, .seed = 4}}) {
    // 30 tokens: past the block of 16, where both re-run the last 16 for each token.
    const auto cached = models::generate(model, exec, prompt, 30, o);
    const auto uncached = models::generate_uncached(model, exec, prompt, 30, o);
    CHECK(cached == uncached);
    CHECK(cached.size() == 30);
  }
  CHECK_THROWS_WITH_AS(models::generate(model, exec, std::vector<std::int32_t>{}, 3), doctest::Contains("the prompt is empty"),
                       ValueError);
  CHECK_THROWS_WITH_AS(models::generate(model, exec, std::vector<std::int32_t>{3, 99}, 3),
                       doctest::Contains("prompt token 99 at position 1"), ValueError);
}

TEST_CASE("GPT: nanoGPT's dropout trains with fresh masks and is off in eval mode") {
  constexpr models::GptConfig dropping{.vocab = 65, .block_size = 16, .layers = 2, .heads = 2, .width = 32, .dropout = 0.2};
  models::GPT<dropping> model(1);
  // The same state-dict names (its dropout layers hold nothing): PyTorch's weights load strictly.
  const auto result = train::load_weights(fixture_path(), model, {.skip = {"ref."}});
  CHECK(result.missing.empty());
  CHECK(result.unexpected.empty());
  CpuExecutor exec(2);
  ag::Tape<CpuExecutor> tape(exec);
  {
    nn::EvalScope evaluating(model);  // eval: no dropout, PyTorch's logits
    const auto logits = model.forward(tape, input());
    CHECK(relative_error(logits.value().data(), floats("ref.logits")) < 1e-5);
  }
  const auto first = model.forward(tape, input());
  const auto second = model.forward(tape, input());
  const std::vector<float> a(first.value().data(), first.value().data() + first.value().size());
  const std::vector<float> b(second.value().data(), second.value().data() + second.value().size());
  CHECK(a != b);  // a fresh mask every forward
  CHECK(relative_error(a.data(), floats("ref.logits")) > 1e-3);
  // A step runs (through the tape: dropout's offsets keep reduce_overhead from capturing it).
  optim::AdamW opt(model, {.lr = 1e-2});
  train::Step step(model, opt, exec);
  const auto x = floats("ref.x");
  const auto y = ints("ref.y");
  for (int i = 0; i < 3; ++i) CHECK(std::isfinite(step.run(x.data(), y.data(), batch, length).item()));
  CHECK(model.describe().find("dropout 0.20") != std::string::npos);
}

TEST_CASE("GPT: bad input is named") {
  Tiny model(0);
  CpuExecutor exec(1);
  ag::Tape<CpuExecutor> tape(exec);
  auto x = input();
  x.value().data()[1 * length + 5] = 70.0f;
  CHECK_THROWS_WITH_AS(model.forward(tape, x), doctest::Contains("token id 70 at batch row 1, position 5"), ValueError);
  x.value().data()[1 * length + 5] = 2.5f;
  CHECK_THROWS_WITH_AS(model.forward(tape, x), doctest::Contains("token id 2.5"), ValueError);
  ag::Var<float, host, dyn, dyn> long_input(Tensor<float, host, dyn, dyn>(Shape{1, length + 1}));
  std::fill(long_input.value().data(), long_input.value().data() + length + 1, 1.0f);
  CHECK_THROWS_WITH_AS(model.forward(tape, long_input), doctest::Contains("T = 17 positions, more than the model's maximum of 16"),
                       ShapeError);
}

TEST_CASE("text: tokenizer, split and windows (nanoGPT's get_batch), and their errors") {
  const std::string text = "hello world\nhello kiln\n";
  const auto tok = data::CharTokenizer::from_text(text);
  CHECK(tok.chars() == "\n dehiklnorw");
  const auto ids = tok.encode(text);
  CHECK(tok.decode(ids) == text);
  CHECK(ids[0] == 4);  // 'h'
  CHECK_THROWS_WITH_AS(tok.encode("hello, world"), doctest::Contains("the character ',' at position 5"), ValueError);
  CHECK_THROWS_AS(data::CharTokenizer::from_text(""), ValueError);
  const auto [train, val] = data::split_tokens(ids, 0.9);
  CHECK(train.size() == 20);
  CHECK(val.size() == 3);
  CHECK_THROWS_WITH_AS(data::TokenWindows(val, 3, "tiny.txt (validation)"),
                       doctest::Contains("tiny.txt (validation) has 3 tokens, too few for one window of T + 1 = 4"),
                       ValueError);
  const data::TokenWindows windows(train, 4, "tiny.txt (train)");
  std::vector<float> f1, f2;
  std::vector<std::int32_t> l1, l2;
  Generator g1(5), g2(5);
  windows.sample(3, g1, f1, l1);
  windows.sample(3, g2, f2, l2);
  CHECK(f1 == f2);  // the same seed, the same windows
  CHECK(l1 == l2);
  for (index_t b = 0; b < 3; ++b)
    for (index_t t = 0; t + 1 < 4; ++t) CHECK(l1[std::size_t(b * 4 + t)] == std::int32_t(f1[std::size_t(b * 4 + t + 1)]));
  // The shipped text: nanoGPT's 65 characters.
  const auto shakespeare = data::read_text(std::string(KILN_SOURCE_DIR) + "/data/tinyshakespeare.txt.gz");
  CHECK(shakespeare.size() == 1115394);
  CHECK(data::CharTokenizer::from_text(shakespeare).size() == 65);
}

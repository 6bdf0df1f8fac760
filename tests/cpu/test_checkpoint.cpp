// Checkpoints: the safetensors reader against the reference writer's bytes and against damaged
// files (every failure a DataError naming the file), weights in PyTorch's names, and training
// resumed from a checkpoint continuing bit for bit where the uninterrupted run goes.
#include <kiln/train.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/checkpoint_dir.hpp>

#include <doctest/doctest.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "data_helpers.hpp"

namespace {

using namespace kiln;
namespace fs = std::filesystem;
using kiln_test::Bytes;
using kiln_test::check_data_error;

fs::path scratch_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kiln_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

Bytes from_hex(const std::string& hex) {
  Bytes out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(std::uint8_t(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// safetensors.torch.save({"a": arange(6).reshape(2, 3) * 0.5 (float32), "b": tensor(7) (int64),
// "c": tensor([1.5, -2.0], bfloat16)}, metadata={"format": "pt"}) with safetensors 0.8.0.
const char* reference_file_hex =
    "c8000000000000007b225f5f6d657461646174615f5f223a7b22666f726d6174223a227074227d2c2262223a7b226474797065223a"
    "22493634222c227368617065223a5b5d2c22646174615f6f666673657473223a5b302c385d7d2c2261223a7b226474797065223a22"
    "463332222c227368617065223a5b322c335d2c22646174615f6f666673657473223a5b382c33325d7d2c2263223a7b226474797065"
    "223a2242463136222c227368617065223a5b325d2c22646174615f6f666673657473223a5b33322c33365d7d7d2020202007000000"
    "00000000000000000000003f0000803f0000c03f0000004000002040c03f00c0";

// A file with a header we write by hand, for the damaged-header cases.
Bytes with_header(const std::string& header, const Bytes& data) {
  Bytes out(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = std::uint8_t(std::uint64_t(header.size()) >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

void expect_parse_error(const Bytes& bytes, std::initializer_list<std::string> parts) {
  check_data_error([&] { (void)io::SafetensorsFile::parse(bytes, "damaged.safetensors"); }, "damaged.safetensors",
                   parts);
}

}  // namespace

TEST_CASE("safetensors: reads the reference writer's file") {
  const auto f = io::SafetensorsFile::parse(from_hex(reference_file_hex), "ref.safetensors");
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.metadata().at("format") == "pt");
  CHECK_FALSE(f.has_checksum());
  float a[6];
  f.read("a", dtype::f32, {2, 3}, a);
  for (int i = 0; i < 6; ++i) CHECK(a[i] == 0.5f * float(i));
  std::int64_t b = 0;
  f.read("b", dtype::i64, {}, &b);
  CHECK(b == 7);
  bf16 c[2];
  f.read("c", dtype::bf16, {2}, c);
  CHECK(float(c[0]) == 1.5f);
  CHECK(float(c[1]) == -2.0f);
  check_data_error([&] { f.read("a", dtype::f32, {3, 2}, a); }, "ref.safetensors",
                   {"tensor \"a\"", "expected shape [3, 2]", "found [2, 3]"});
  check_data_error([&] { f.read("a", dtype::f64, {2, 3}, a); }, "ref.safetensors", {"expected dtype F64", "found F32"});
  check_data_error([&] { (void)f.info("d"); }, "ref.safetensors", {"no tensor named \"d\""});
}

TEST_CASE("safetensors: the writer's file reads back, aligned and checksummed") {
  io::SafetensorsWriter w;
  const std::vector<float> x{1.f, -2.f, 3.5f};
  const std::vector<std::int64_t> n{42};
  w.add_values<float>("layer.\"quoted\"\\name", {3}, x);
  w.add_values<std::int64_t>("n", {}, n);
  w.set_metadata("note", "line\nbreak");
  CHECK_THROWS_AS(w.add_values<float>("n", {3}, x), ValueError);
  CHECK_THROWS_AS(w.add_values<float>("m", {4}, x), ValueError);
  const Bytes bytes = w.serialize();
  const auto f = io::SafetensorsFile::parse(bytes, "mine.safetensors");
  CHECK(f.data_start() % 8 == 0);
  CHECK(f.has_checksum());
  CHECK(f.metadata().at("note") == "line\nbreak");
  float back[3];
  f.read("layer.\"quoted\"\\name", dtype::f32, {3}, back);
  CHECK(std::memcmp(back, x.data(), sizeof back) == 0);
  // The checksum covers the data: one flipped bit in it is caught.
  Bytes flipped = bytes;
  flipped[f.data_start() + 5] ^= 0x10;
  expect_parse_error(flipped, {"checksum mismatch"});
}

TEST_CASE("safetensors: damaged files are DataErrors that say what is wrong") {
  const Bytes ref = from_hex(reference_file_hex);
  expect_parse_error(Bytes(ref.begin(), ref.begin() + 5), {"truncated", "5 bytes"});
  expect_parse_error(Bytes(ref.begin(), ref.begin() + 100), {"header length 200", "runs past the end"});
  Bytes huge = ref;
  huge[7] = 0x7f;
  expect_parse_error(huge, {"over the format's limit"});
  expect_parse_error(Bytes(ref.begin(), ref.end() - 3), {"run past", "data"});
  const Bytes data(8, 0);
  expect_parse_error(with_header("[1, 2]", data), {"not a JSON object"});
  expect_parse_error(with_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", data),
                     {"not valid JSON", "ends inside an object"});
  expect_parse_error(with_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
                                 "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [2, 10]}}",
                                 Bytes(10, 0)),
                     {"overlap", "\"b\""});
  expect_parse_error(with_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", data),
                     {"data bytes [0, 4) belong to no tensor"});
  expect_parse_error(with_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", data),
                     {"after the last tensor"});
  expect_parse_error(with_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", data),
                     {"tensor \"a\"", "needs 12 bytes", "hold 8"});
  expect_parse_error(with_header("{\"a\": {\"dtype\": \"Q7\", \"shape\": [2], \"data_offsets\": [0, 8]}}", data),
                     {"unknown dtype \"Q7\""});
  expect_parse_error(with_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", data),
                     {"run backwards"});
  expect_parse_error(with_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4], "
                                 "\"data_offsets\": [0, 8]}}",
                                 data),
                     {"overflows"});
  expect_parse_error(with_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", data),
                     {"non-negative"});
  expect_parse_error(with_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
                                 "\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
                                 data),
                     {"appears twice"});
  expect_parse_error(with_header("{\"__metadata__\": {\"k\": 3}}", {}), {"metadata values are strings"});
  expect_parse_error(with_header(std::string(100, '[') + std::string(100, ']'), {}), {"not a JSON object"});
  expect_parse_error(with_header("{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}", {}),
                     {"nested deeper"});
  check_data_error([] { (void)io::SafetensorsFile::open("/nonexistent/model.safetensors"); },
                   "/nonexistent/model.safetensors", {"cannot open"});
}

// Fuzz-style: thousands of mutated files (bit flips, byte runs, truncation, splices, edited
// header numbers). Each either parses — and then every tensor lies inside the file — or is a
// DataError; nothing else escapes, and nothing reads outside the buffer (the ASan build of this
// test, kiln_tests_safetensors_asan, would report it).
TEST_CASE("safetensors: mutated files parse or fail as DataError, never anything else") {
  io::SafetensorsWriter w;
  std::vector<float> v(40);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.25f;
  w.add_values<float>("0.weight", {5, 8}, v);
  w.add_values<float>("0.bias", {5}, std::span<const float>(v.data(), 5));
  const std::vector<std::int64_t> t{3};
  w.add_values<std::int64_t>("optimizer.step.0.weight", {}, t);
  const Bytes good = w.serialize();
  const Bytes ref = from_hex(reference_file_hex);
  Generator g(2026);
  int parsed = 0, refused = 0;
  for (int iter = 0; iter < 6000; ++iter) {
    Bytes b = (iter % 3 == 0) ? ref : good;
    const int kind = int(g.below(6));
    const auto pos = [&] { return std::size_t(g.below(std::uint32_t(b.size()))); };
    if (kind == 0) {  // flip bits
      for (int k = 0, n = 1 + int(g.below(4)); k < n; ++k) b[pos()] ^= std::uint8_t(1u << g.below(8));
    } else if (kind == 1) {  // truncate
      b.resize(pos());
    } else if (kind == 2) {  // overwrite a run with one byte value
      const std::size_t p = pos();
      const std::uint8_t c = std::uint8_t(g.below(256));
      for (std::size_t i = p; i < std::min(b.size(), p + 1 + g.below(16)); ++i) b[i] = c;
    } else if (kind == 3) {  // insert or delete bytes inside the header
      const std::size_t p = 8 + g.below(std::uint32_t(std::min<std::size_t>(b.size() - 8, 150)));
      if (g.below(2)) b.insert(b.begin() + std::ptrdiff_t(p), std::uint8_t("0123456789,[]{}\":-e."[g.below(20)]));
      else b.erase(b.begin() + std::ptrdiff_t(p));
    } else if (kind == 4) {  // change a digit of the header (offsets, shapes, the length)
      std::vector<std::size_t> digits;
      for (std::size_t i = 8; i < std::min<std::size_t>(b.size(), 400); ++i)
        if (b[i] >= '0' && b[i] <= '9') digits.push_back(i);
      if (!digits.empty()) b[digits[g.below(std::uint32_t(digits.size()))]] = std::uint8_t('0' + g.below(10));
    } else {  // a header length anywhere from 0 to huge
      const std::uint64_t n = g.below(2) ? g.below(400) : (std::uint64_t(g.next_u64()));
      for (int i = 0; i < 8; ++i) b[std::size_t(i)] = std::uint8_t(n >> (8 * i));
    }
    try {
      const auto f = io::SafetensorsFile::parse(b, "fuzz.safetensors");
      for (const auto& info : f.tensors()) {
        REQUIRE(f.data_start() + info.end <= f.size());
        volatile std::uint8_t sink = 0;
        for (std::uint8_t x : f.bytes(info)) sink = std::uint8_t(sink ^ x);
        (void)sink;
      }
      ++parsed;
    } catch (const DataError& e) {
      REQUIRE(std::string(e.what()).find("fuzz.safetensors") != std::string::npos);
      ++refused;
    }
  }
  MESSAGE("mutated files: ", parsed, " parsed, ", refused, " refused");
  CHECK(refused > 4000);
}

// ---- models ----------------------------------------------------------------------------------

namespace {

using Mlp = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::ReLU, nn::Linear<8, 4>>;
using DropMlp = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Dropout<0.25>, nn::Linear<16, 4>>;

template <class Model>
std::vector<std::uint8_t> state_bytes(const Model& m) {
  std::vector<std::uint8_t> out;
  io::for_each_state(m, [&](const std::string&, auto& item, io::state_kind) {
    using I = std::remove_cvref_t<decltype(item)>;
    if constexpr (std::is_same_v<I, std::int64_t>) {
      const auto* p = reinterpret_cast<const std::uint8_t*>(&item);
      out.insert(out.end(), p, p + sizeof item);
    } else {
      const auto& t = train::detail::tensor_of_item(item);
      const auto* p = reinterpret_cast<const std::uint8_t*>(t.data());
      out.insert(out.end(), p, p + t.size() * index_t(sizeof(*t.data())));
    }
  });
  return out;
}

data::Dataset synthetic(index_t n, std::uint64_t seed) {
  Generator g(seed);
  data::Dataset ds;
  ds.n = n;
  ds.d = 12;
  ds.num_classes = 4;
  for (index_t i = 0; i < n * 12; ++i) ds.features.push_back(g.uniform(-1.f, 1.f));
  for (index_t i = 0; i < n; ++i) ds.labels.push_back(std::int32_t(g.below(4)));
  return ds;
}

}  // namespace

TEST_CASE("weights: PyTorch's names, a round trip, and a mismatch leaves the model untouched") {
  Mlp a(1), b(2);
  std::vector<std::string> names;
  io::for_each_state(a, [&](const std::string& name, auto&, io::state_kind) { names.push_back(name); });
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"});
  const fs::path dir = scratch_dir("weights");
  const std::string path = (dir / "mlp.safetensors").string();
  train::save_weights(path, a);
  const auto f = io::SafetensorsFile::open(path);
  CHECK(f.info("0.weight").shape == std::vector<std::int64_t>{16, 12});  // [out, in], as torch
  CHECK(f.metadata().at("format") == "pt");
  train::load_weights(path, b);
  CHECK(state_bytes(a) == state_bytes(b));

  using Wider = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 9>, nn::ReLU, nn::Linear<9, 4>>;
  Wider c(3);
  const auto before = state_bytes(c);
  check_data_error([&] { train::load_weights(path, c); }, path,
                   {"3 with another shape or dtype: 2.weight (model [9, 16] F32, file [8, 16] F32), 2.bias"});
  CHECK(state_bytes(c) == before);
  using Shorter = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 4>>;
  Shorter d(4);
  check_data_error([&] { train::load_weights(path, d); }, path,
                   {"2.weight (model [4, 16] F32, file [8, 16] F32)", "2 of the file's tensors not in the model: 4.bias, "
                                                                     "4.weight"});
  using Deeper = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::ReLU, nn::Linear<8, 4>, nn::ReLU,
                                nn::Linear<4, 4>>;
  Deeper e(5);
  check_data_error([&] { train::load_weights(path, e); }, path,
                   {"2 of the model's tensors not in the file: 6.weight, 6.bias"});
  using NoBias = nn::Sequential<nn::Linear<12, 16, false>, nn::ReLU, nn::Linear<16, 8>, nn::ReLU, nn::Linear<8, 4>>;
  NoBias nb(6);
  check_data_error([&] { train::load_weights(path, nb); }, path, {"1 of the file's tensors not in the model: 0.bias"});
  const auto loose = train::load_weights(path, nb, {.strict = false});
  CHECK(loose.missing.empty());
  CHECK(loose.unexpected == std::vector<std::string>{"0.bias"});
  fs::remove_all(dir);
}

TEST_CASE("weights: PyTorch's load options — non-strict, a skipped head, renamed names, short errors") {
  const fs::path dir = scratch_dir("load_options");
  const std::string path = (dir / "mlp.safetensors").string();
  Mlp a(1);
  train::save_weights(path, a);
  auto values = [](const auto& var) { return std::vector<float>(var.value().data(), var.value().data() + var.value().size()); };

  // A new head for another class count: the old one skipped on both sides keeps its initial values.
  using NewHead = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::ReLU, nn::Linear<8, 7>>;
  NewHead h(9);
  const auto head_before = values(h.layer<4>().weight());
  check_data_error([&] { train::load_weights(path, h); }, path, {"4.weight (model [7, 8] F32, file [4, 8] F32)"});
  const auto r = train::load_weights(path, h, {.skip = {"4."}});
  CHECK(r.missing.empty());
  CHECK(r.unexpected.empty());
  CHECK(r.skipped == 4);  // the model's 4.weight and 4.bias, and the file's
  CHECK(values(h.layer<4>().weight()) == head_before);
  CHECK(values(h.layer<0>().weight()) == values(a.layer<0>().weight()));

  // Names saved by another wrapper ("module." from DataParallel): renamed on load.
  io::SafetensorsWriter w;
  io::SafetensorsFile original = io::SafetensorsFile::open(path);
  for (const auto& t : original.tensors()) {
    const auto bytes = original.bytes(t);
    w.add("module." + t.name, dtype::f32, t.shape, bytes);
  }
  const std::string wrapped = (dir / "wrapped.safetensors").string();
  w.write(wrapped);
  Mlp b(2);
  check_data_error([&] { train::load_weights(wrapped, b); }, wrapped,
                   {"6 of the model's tensors not in the file: 0.weight, 0.bias, 2.weight, 2.bias, 4.weight and 1 more",
                    "6 of the file's tensors not in the model: module.0.bias,"});
  train::load_weights(wrapped, b, {.rename = [](const std::string& n) { return n.substr(std::string("module.").size()); }});
  CHECK(state_bytes(a) == state_bytes(b));

  // Non-strict: what matches loads, the rest is returned (PyTorch's missing_keys / unexpected_keys).
  using Deeper = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::ReLU, nn::Linear<8, 4>, nn::ReLU,
                                nn::Linear<4, 4>>;
  Deeper d(5);
  const auto loose = train::load_weights(wrapped, d, {.strict = false, .rename = [](const std::string& n) {
                                                        return n.rfind("module.4.", 0) == 0 ? std::string() : n.substr(7);
                                                      }});
  CHECK(loose.missing == std::vector<std::string>{"4.weight", "4.bias", "6.weight", "6.bias"});
  CHECK(loose.unexpected.empty());
  fs::remove_all(dir);
}

TEST_CASE("weights: a convnet's BatchNorm buffers use torch's names and survive a round trip") {
  using Net = nn::Sequential<nn::Unflatten<1, 4, 3>, nn::Conv2d<1, 3, 3, 1, 1>, nn::BatchNorm2d<3>, nn::ReLU,
                             nn::Residual<nn::Sequential<nn::Conv2d<3, 3, 3, 1, 1>, nn::BatchNorm2d<3>>>,
                             nn::GlobalAvgPool, nn::Linear<3, 4>>;
  Net a(7), b(8);
  a.template layer<2>().buffers().batches_tracked = 11;
  a.template layer<2>().buffers().running_var.data()[1] = 2.5f;
  std::vector<std::string> names;
  io::for_each_state(a, [&](const std::string& name, auto&, io::state_kind) { names.push_back(name); });
  CHECK(names == std::vector<std::string>{"1.weight", "1.bias", "2.weight", "2.bias", "2.running_mean",
                                          "2.running_var", "2.num_batches_tracked", "4.body.0.weight", "4.body.0.bias",
                                          "4.body.1.weight", "4.body.1.bias", "4.body.1.running_mean",
                                          "4.body.1.running_var", "4.body.1.num_batches_tracked", "6.weight", "6.bias"});
  const fs::path dir = scratch_dir("convnet");
  const std::string path = (dir / "net.safetensors").string();
  train::save_weights(path, a);
  train::load_weights(path, b);
  CHECK(state_bytes(a) == state_bytes(b));
  CHECK(b.template layer<2>().buffers().batches_tracked == 11);
  fs::remove_all(dir);
}

TEST_CASE("model_state: the untyped entries are for_each_state's tensors, and the checksum reads them") {
  using Net = nn::Sequential<nn::Unflatten<1, 4, 3>, nn::Conv2d<1, 3, 3, 1, 1>, nn::BatchNorm2d<3>, nn::ReLU,
                             nn::Dropout<0.25>, nn::GlobalAvgPool, nn::Linear<3, 4>>;
  Net net(3);
  net.template layer<2>().buffers().batches_tracked = 5;
  net.template layer<4>().set_rng(17, 40);
  const io::ModelState state = io::model_state(net);
  std::size_t i = 0;
  io::for_each_state(net, [&](const std::string& name, auto& item, io::state_kind kind) {
    REQUIRE(i < state.tensors.size());
    const io::StateTensor& t = state.tensors[i++];
    CHECK(t.name == name);
    CHECK(t.kind == kind);
    using I = std::remove_cvref_t<decltype(item)>;
    if constexpr (std::is_same_v<I, std::int64_t>) {
      CHECK(t.type == dtype::i64);
      CHECK(t.shape.rank == 0);
      CHECK(t.data == static_cast<void*>(&item));
      CHECK(t.bytes == sizeof(std::int64_t));
    } else {
      const auto& tensor = train::detail::tensor_of_item(item);
      CHECK(t.type == dtype::f32);
      CHECK(t.shape == tensor.shape());
      CHECK(t.data == static_cast<const void*>(tensor.data()));
      CHECK(t.bytes == tensor.bytes());
    }
  });
  CHECK(i == state.tensors.size());
  REQUIRE(state.rngs.size() == 1);
  CHECK(state.rngs[0].prefix == "4.");
  CHECK(state.rngs[0].get() == std::pair<std::uint64_t, std::uint64_t>{17, 40});
  state.rngs[0].set(18, 41);
  CHECK(net.template layer<4>().seed() == 18);
  CHECK(net.template layer<4>().offset() == 41);
  // The checksum is CRC-32C over every tensor's bytes in order, counters included.
  const std::vector<std::uint8_t> bytes = state_bytes(net);
  CHECK(train::state_checksum(net) == io::crc32c(bytes.data(), bytes.size(), 0));
  net.template layer<2>().buffers().batches_tracked = 6;
  CHECK(train::state_checksum(net) != io::crc32c(bytes.data(), bytes.size(), 0));
}

// ---- resume ----------------------------------------------------------------------------------

namespace {

// Trains `epochs` epochs of a 100-sample set in batches of 8 (the last one 4), optionally
// stopping after `stop_after` micro-batches to save a checkpoint and continuing in NEW objects
// (another initial seed, so loading must overwrite everything) from that file. Returns the final
// model state and optimizer state as bytes.
template <class Model, class Policy, class MakeOpt>
std::vector<std::uint8_t> run(MakeOpt make_opt, int epochs, index_t accumulate, index_t stop_after,
                              const std::string& path) {
  const data::Dataset ds = synthetic(100, 3);
  CpuExecutor exec(2);
  auto model = std::make_unique<Model>(11);
  auto opt = make_opt(*model);
  using Opt = std::remove_cvref_t<decltype(*opt)>;
  using StepT = train::Step<Model, Opt, CpuExecutor, Policy>;
  const index_t batches = 13 * epochs / accumulate;  // optimizer steps in all (13 batches an epoch)
  auto make_step = [&](Model& m, Opt& o) {
    auto s = std::make_unique<StepT>(m, o, exec, Policy{}, train::CrossEntropy{}, train::StepOptions{.accumulate = accumulate});
    s->set_schedule(optim::CosineAnnealingLr(5e-3, batches));
    return s;
  };
  auto step = make_step(*model, *opt);
  data::Loader loader(ds, {.batch_size = 8, .seed = 5, .workers = 1});
  index_t epoch = 0, first = 0;
  if (stop_after > 0) {
    bool stopped = false;
    for (; epoch < epochs && !stopped; ++epoch) {
      loader.start_epoch(epoch);
      while (const auto* b = loader.next()) {
        (*step)(*b);
        if (step->micro_batches() == stop_after) {
          REQUIRE(step->at_step_boundary());
          train::save_checkpoint(path, *step, {epoch, loader.batches_taken()});
          stopped = true;
          break;
        }
      }
    }
    // Everything rebuilt from scratch, differently initialised, then loaded.
    model = std::make_unique<Model>(99);
    opt = make_opt(*model);
    step = make_step(*model, *opt);
    const auto info = train::load_checkpoint(path, *step);
    CHECK(info.micro_batches == stop_after);
    epoch = info.position.epoch;
    first = info.position.batch;
  }
  for (; epoch < epochs; ++epoch) {
    loader.start_epoch(epoch, first);
    first = 0;
    while (const auto* b = loader.next()) (*step)(*b);
  }
  auto out = state_bytes(*model);
  for (const auto& buf : opt->state_buffers()) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(buf.data);
    out.insert(out.end(), p, p + opt->table().total_size() * index_t(sizeof(float)));
  }
  for (index_t c : opt->param_counters()) out.push_back(std::uint8_t(c));
  if constexpr (requires { model->template layer<2>().offset(); }) out.push_back(std::uint8_t(model->template layer<2>().offset()));
  return out;
}

}  // namespace

TEST_CASE("resume: a checkpoint mid-epoch continues bit for bit (AdamW, SGD momentum, dropout, fp16, accumulation)") {
  const fs::path dir = scratch_dir("resume");
  const std::string path = (dir / "mid.safetensors").string();
  auto adamw = [](auto& m) { return std::make_unique<optim::AdamW<host>>(m, optim::AdamWOptions{.lr = 5e-3}); };
  auto sgd = [](auto& m) { return std::make_unique<optim::SGD<host>>(m, optim::SgdOptions{.lr = 5e-3, .momentum = 0.9}); };
  SUBCASE("AdamW fp32") {
    const auto whole = run<Mlp, kiln::policy<>>(adamw, 3, 1, 0, path);
    CHECK(run<Mlp, kiln::policy<>>(adamw, 3, 1, 17, path) == whole);  // epoch 1, batch 4
    CHECK(run<Mlp, kiln::policy<>>(adamw, 3, 1, 26, path) == whole);  // an epoch boundary
  }
  SUBCASE("SGD with momentum, dropout") {
    const auto whole = run<DropMlp, kiln::policy<>>(sgd, 3, 1, 0, path);
    CHECK(run<DropMlp, kiln::policy<>>(sgd, 3, 1, 20, path) == whole);
  }
  SUBCASE("fp16_mixed with the loss scaler, 13 micro-batches as 13 steps") {
    using P = kiln::policy<kiln::precision::fp16_mixed>;
    const auto whole = run<Mlp, P>(adamw, 2, 1, 0, path);
    CHECK(run<Mlp, P>(adamw, 2, 1, 9, path) == whole);
  }
  SUBCASE("accumulation over 13 micro-batches, force_eager") {
    using P = kiln::policy<kiln::accumulate<kiln::dyn>, kiln::stance::force_eager>;
    const auto whole = run<Mlp, P>(adamw, 2, 13, 0, path);
    CHECK(run<Mlp, P>(adamw, 2, 13, 13, path) == whole);
  }
  fs::remove_all(dir);
}

TEST_CASE("resume: a checkpoint from another run setup is refused before anything changes") {
  const fs::path dir = scratch_dir("refuse");
  const std::string path = (dir / "c.safetensors").string();
  CpuExecutor exec(1);
  Mlp m(1);
  optim::AdamW opt(m, {.lr = 1e-3});
  train::Step step(m, opt, exec);
  train::save_checkpoint(path, step, {0, 0});

  Mlp m2(2);
  optim::SGD sgd(m2, {.lr = 1e-3});
  train::Step sgd_step(m2, sgd, exec);
  const auto before = state_bytes(m2);
  check_data_error([&] { train::load_checkpoint(path, sgd_step); }, path, {"optimizer AdamW", "uses SGD"});
  CHECK(state_bytes(m2) == before);

  optim::AdamW opt2(m2, {.lr = 1e-3});
  train::Step acc(m2, opt2, exec, kiln::policy<kiln::accumulate<2>>{});
  check_data_error([&] { train::load_checkpoint(path, acc); }, path, {"1 micro-batches per optimizer step",
                                                                       "this run uses 2"});
  CHECK(state_bytes(m2) == before);

  optim::AdamW ams(m2, {.lr = 1e-3, .amsgrad = true});
  train::Step ams_step(m2, ams, exec);
  check_data_error([&] { train::load_checkpoint(path, ams_step); }, path,
                   {"optimizer.max_exp_avg_sq.0.weight"});
  CHECK(state_bytes(m2) == before);

  train::save_weights((dir / "w.safetensors").string(), m);  // weights only: no training state
  check_data_error([&] { train::load_checkpoint((dir / "w.safetensors").string(), step); },
                   (dir / "w.safetensors").string(), {"kiln.format"});
  fs::remove_all(dir);
}

TEST_CASE("CheckpointDir: keeps the newest K, resumes past a corrupt newest one, cleans stale temporaries") {
  const fs::path dir = scratch_dir("dir");
  CpuExecutor exec(1);
  Mlp m(1);
  optim::AdamW opt(m, {.lr = 1e-2});
  train::Step step(m, opt, exec);
  const data::Dataset ds = synthetic(40, 4);
  data::Loader loader(ds, {.batch_size = 8, .seed = 1, .workers = 0});
  {
    kiln_test::write_bytes(dir / ".step-000000003.safetensors.tmp.12345", Bytes(10, 1));
    train::CheckpointDir ckpt(dir.string(), {.keep = 2});
    CHECK_FALSE(fs::exists(dir / ".step-000000003.safetensors.tmp.12345"));
    CHECK_FALSE(ckpt.resume(step).has_value());  // an empty directory: a fresh start
    loader.start_epoch(0);
    while (const auto* b = loader.next()) {
      step(*b);
      ckpt.save(step, {0, loader.batches_taken()});
    }
    const auto files = ckpt.list();
    REQUIRE(files.size() == 2);
    CHECK(files[0] == ckpt.file_for(5));
    CHECK(files[1] == ckpt.file_for(4));
  }
  const auto after5 = state_bytes(m);
  // Corrupt the newest: resume warns and takes step 4.
  {
    std::fstream f(dir / "step-000000005.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  Mlp m2(2);
  optim::AdamW opt2(m2, {.lr = 1e-2});
  train::Step step2(m2, opt2, exec);
  std::vector<std::string> warnings;
  auto previous = set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  train::CheckpointDir ckpt(dir.string(), {.keep = 2});
  const auto info = ckpt.resume(step2);
  set_warning_handler(previous);
  REQUIRE(info.has_value());
  CHECK(info->optimizer_steps == 4);
  CHECK(info->position.batch == 4);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("step-000000005.safetensors") != std::string::npos);
  CHECK(warnings[0].find("checksum mismatch") != std::string::npos);
  // Step 4 + the fifth batch again = the state after 5.
  loader.start_epoch(info->position.epoch, info->position.batch);
  step2(*loader.next());
  CHECK(state_bytes(m2) == after5);
  // Every file corrupt: an error naming them, not a silent fresh start.
  for (const auto& f : ckpt.list()) fs::resize_file(f, 20);
  check_data_error([&] { ckpt.resume(step2); }, dir.string(), {"no checkpoint loads", "truncated"});
  fs::remove_all(dir);
}

TEST_CASE("CheckpointDir: a full disk or an unwritable place fails the save and keeps the previous checkpoint") {
  const fs::path dir = scratch_dir("full");
  CpuExecutor exec(1);
  Mlp m(1);
  optim::AdamW opt(m, {.lr = 1e-2});
  train::Step step(m, opt, exec);
  train::CheckpointDir ckpt(dir.string());
  const std::string first = ckpt.save(step, {0, 0});
  const Bytes before = data::read_raw_file(first);
  // A file-size limit makes write() fail with EFBIG, as a full disk fails it with ENOSPC.
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  rlimit small = old_limit;
  small.rlim_cur = 1000;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string message;
  try {
    (void)ckpt.save(step, {0, 0});  // the same step number: would replace the first file
  } catch (const DataError& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  CAPTURE(message);
  CHECK(message.find("writing failed") != std::string::npos);
  CHECK(message.find(first) != std::string::npos);
  CHECK(data::read_raw_file(first) == before);
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  CHECK(entries == 1);  // no temporary left behind
  // A directory that cannot exist (a regular file is in the way: tests run as root, so
  // permissions would not stop them).
  check_data_error([&] { train::CheckpointDir((fs::path(first) / "sub").string()); }, first, {"cannot be created"});
  check_data_error([&] { train::save_weights((fs::path(first) / "w.safetensors").string(), m); }, first,
                   {"cannot write"});
  fs::remove_all(dir);
}

TEST_CASE("weights: kiln loads PyTorch's safetensors state dict and computes its logits within 1e-5") {
  // tests/fixtures/torch_mlp.safetensors, from scripts/golden_safetensors.py (safetensors.torch.save_file).
  const std::string path = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/torch_mlp.safetensors";
  Mlp model(123);
  check_data_error([&] { train::load_weights(path, model); }, path, {"2 of the file's tensors not in the model: input, logits"});
  train::load_weights(path, model, {.strict = false});
  const auto file = io::SafetensorsFile::open(path);
  Tensor<float, host, dyn, 12> xt(5, 12);
  file.read("input", dtype::f32, {5, 12}, xt.data());
  std::vector<float> want(20);
  file.read("logits", dtype::f32, {5, 4}, want.data());
  CpuExecutor exec(1);
  ag::Tape<CpuExecutor> tape(exec);
  nn::EvalScope evaluating(model);
  const auto logits = model.forward(tape, ag::Var<float, host, dyn, 12>(std::move(xt)));
  REQUIRE(logits.value().size() == 20);
  for (std::size_t i = 0; i < 20; ++i) CHECK(std::abs(logits.value().data()[i] - want[i]) <= 1e-5f);
}

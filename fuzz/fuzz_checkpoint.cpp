// libFuzzer harness: the safetensors reader and the checkpoint loader's checks on any bytes —
// parse, read every tensor's bytes, then stage the file into a small MLP (names, shapes, dtypes)
// and apply it — and the TensorBoard event reader (TFRecord framing, Event protobuf). Every
// failure must be a kiln::DataError.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/io/tensorboard.hpp"
#include "kiln/nn/activation.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/sequential.hpp"
#include "kiln/train/checkpoint.hpp"

namespace {
// The architecture of tests/fixtures/torch_mlp.safetensors, so the seed reaches the success path.
using Mlp = kiln::nn::Sequential<kiln::nn::Linear<12, 16>, kiln::nn::ReLU, kiln::nn::Linear<16, 8>, kiln::nn::ReLU,
                                 kiln::nn::Linear<8, 4>>;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto file = kiln::io::SafetensorsFile::parse(std::vector<std::uint8_t>(data, data + size), "fuzz.safetensors");
    std::size_t sum = 0;
    for (const auto& t : file.tensors())
      for (std::uint8_t b : file.bytes(t)) sum += b;  // every byte a tensor claims must be readable
    (void)sum;
    static Mlp model(0);
    std::vector<kiln::train::detail::Apply> apply;
    kiln::train::detail::stage_model_state(file, kiln::io::model_state(model), {.strict = false}, apply);
    for (auto& a : apply) a();
  } catch (const kiln::DataError&) {
  }
  try {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    for (const auto& record : kiln::io::read_tfrecords(bytes, "fuzz.tfevents")) (void)kiln::io::decode_event(record);
  } catch (const kiln::DataError&) {
  }
  return 0;
}

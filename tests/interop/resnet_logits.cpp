// resnet_logits — the kiln side of scripts/torch_resnet_interop.py: loads a state_dict that
// torchvision's resnet50 saved (safetensors.torch.save_file) into kiln::models::ResNet50<1000>
// with no mapping, computes the eval logits of the images in --input ("images", [N, 3, 224,
// 224] float32), writes them to --output ("logits") and saves the model's weights to
// --save-weights for PyTorch to load back with strict=True.
//
//   resnet_logits --weights W.safetensors --input X.safetensors --output Y.safetensors
//                 --save-weights K.safetensors [--threads 2]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/io/safetensors.hpp"
#include "kiln/models/resnet.hpp"
#include "kiln/train.hpp"
#include "kiln/train/checkpoint.hpp"

int main(int argc, char** argv) {
  std::string weights, input, output, save;
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--weights") weights = argv[i + 1];
    else if (flag == "--input") input = argv[i + 1];
    else if (flag == "--output") output = argv[i + 1];
    else if (flag == "--save-weights") save = argv[i + 1];
    else if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "resnet_logits: unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  if (weights.empty() || input.empty() || output.empty() || save.empty() || threads < 1) {
    std::fprintf(stderr, "usage: resnet_logits --weights W --input X --output Y --save-weights K [--threads N]\n");
    return 2;
  }
  try {
    using namespace kiln;
    using Model = models::ResNet50<1000, 224>;
    constexpr index_t pixels = 3 * 224 * 224;
    Model model(0);
    train::load_weights(weights, model);  // strict: every name and shape as torchvision's

    const auto in = io::SafetensorsFile::open(input);
    const auto& info = in.info("images");
    KILN_CHECK(info.shape.size() == 4 && info.shape[1] == 3 && info.shape[2] == 224 && info.shape[3] == 224, DataError,
               input, ": \"images\" must be [N, 3, 224, 224], found ", io::shape_text(info.shape));
    const index_t n = index_t(info.shape[0]);
    ag::Var<float, host, dyn, pixels> x(Tensor<float, host, dyn, pixels>(Shape{n, pixels}));
    in.read("images", dtype::f32, info.shape, x.value().data());

    CpuExecutor exec(threads);
    ag::Tape<CpuExecutor> tape(exec);
    nn::EvalScope evaluating(model);
    const auto y = model.forward(tape, x);
    const float* logits = y.value().data();
    io::SafetensorsWriter w;
    w.add_values<float>("logits", {n, 1000}, std::span<const float>(logits, std::size_t(n * 1000)));
    w.write(output);
    train::save_weights(save, model);
    std::printf("resnet_logits: %lld images, logits written to %s, weights to %s\n", static_cast<long long>(n),
                output.c_str(), save.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_logits: %s\n", e.what());
    return 1;
  }
}

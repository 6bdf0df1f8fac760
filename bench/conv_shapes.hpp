// bench/conv_shapes.hpp — the convolutions of the reference convnets, one row per distinct shape
// with how many times a training step runs it, so a per-shape timing adds up to a model's
// convolution time. Shared by bench/conv_shapes (kiln's kernels) and written out for its PyTorch
// peer (bench/torch_conv_shapes.py reads the same rows from the command line).
#pragma once

#include <string>
#include <vector>

#include "kiln/config.hpp"

namespace kiln_bench {

struct ConvRow {
  const char* model;  // resnet9_w32 (32x32), resnet18 / resnet50 at their input size
  int size;           // the model's input side
  kiln::index_t c_in, hw, c_out, k, stride, pad;  // square input hw x hw, square kernel k
  int count;          // convolutions of this shape in one forward
};

// ResNet-9 (bench/convnet's width 32, kiln/models/convnets.hpp), torchvision's ResNet-18 and
// ResNet-50 (v1.5: the stride on the 3x3; kiln/models/resnet.hpp) at `size`.
inline std::vector<ConvRow> conv_rows(const std::string& model, int size) {
  std::vector<ConvRow> rows;
  auto add = [&](kiln::index_t c_in, kiln::index_t hw, kiln::index_t c_out, kiln::index_t k, kiln::index_t stride,
                 int count) { rows.push_back({model.c_str(), size, c_in, hw, c_out, k, stride, k / 2, count}); };
  if (model == "resnet9_w32") {  // 32x32 input, pools halve 32 -> 16 -> 8 -> 4
    add(3, 32, 32, 3, 1, 1);
    add(32, 32, 64, 3, 1, 1);
    add(64, 16, 64, 3, 1, 2);
    add(64, 16, 128, 3, 1, 1);
    add(128, 8, 256, 3, 1, 1);
    add(256, 4, 256, 3, 1, 2);
    return rows;
  }
  const kiln::index_t s1 = size / 4;  // after the 7x7 stride-2 stem and the stride-2 max pool
  add(3, size, 64, 7, 2, 1);
  if (model == "resnet18") {
    const int blocks[4] = {2, 2, 2, 2};
    kiln::index_t c = 64, hw = s1;
    for (int stage = 0; stage < 4; ++stage) {
      const kiln::index_t w = kiln::index_t(64) << stage;
      const kiln::index_t stride = stage == 0 ? 1 : 2;
      add(c, hw, w, 3, stride, 1);  // first block's first conv
      if (stride != 1 || c != w) add(c, hw, w, 1, stride, 1);  // downsample
      hw /= stride;
      add(w, hw, w, 3, 1, 2 * blocks[stage] - 1);  // the rest of the block convs
      c = w;
    }
  } else if (model == "resnet50") {
    const int blocks[4] = {3, 4, 6, 3};
    kiln::index_t c = 64, hw = s1;
    for (int stage = 0; stage < 4; ++stage) {
      const kiln::index_t w = kiln::index_t(64) << stage, out = 4 * w;
      const kiln::index_t stride = stage == 0 ? 1 : 2;
      add(c, hw, w, 1, 1, 1);       // first block: 1x1 down at the input's size
      add(w, hw, w, 3, stride, 1);  // 3x3 at the stride
      add(c, hw, out, 1, stride, 1);  // downsample
      hw /= stride;
      add(w, hw, out, 1, 1, blocks[stage]);  // 1x1 up, every block
      add(out, hw, w, 1, 1, blocks[stage] - 1);  // the other blocks' 1x1 down
      add(w, hw, w, 3, 1, blocks[stage] - 1);    // and their 3x3
      c = out;
    }
  }
  return rows;
}

}  // namespace kiln_bench

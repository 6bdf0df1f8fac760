// kiln/models/resnet.hpp — torchvision's ResNets as types: ResNet18 / 34 / 50 / 101 with the
// head's class count and the input size as parameters.
//
//   using Net = kiln::models::ResNet50<1000, 224>;   // 25,557,032 parameters, as torchvision's
//   Net::on<kiln::cuda> model(/*seed=*/0);
//
// The layout is torchvision's (v1.5): a 7x7 stride-2 stem, BatchNorm, ReLU and a 3x3 stride-2 max
// pool; four stages of blocks (BasicBlock for 18 / 34, Bottleneck for 50 / 101, expansion 4); the
// stride on the 3x3 convolution; convolutions without bias; a projection (1x1 convolution and
// BatchNorm) on the first block of a stage whose shape changes; global average pooling and a
// Linear head. A block is a Residual with ReLU after its sum, in the same pass (torchvision's
// relu(out + identity)). A stage is nn::Repeat<Blocks, Block, FirstBlock> (torchvision's
// _make_layer), so its repeated blocks are compiled once. Inputs are flat rows of 3 x Size x Size
// (an nn::Unflatten starts the model).
//
// Layers carry torchvision's attribute names (nn::Named), so the state_dict names are
// torchvision's — "conv1.weight", "layer1.0.conv1.weight", "layer2.0.downsample.0.weight",
// "fc.bias" — and torchvision.models.resnet50().state_dict(), saved with safetensors, loads with
// train::load_weights and no mapping (and kiln's saved weights load into torchvision strictly).
#pragma once

#include <type_traits>

#include "kiln/nn/activation.hpp"
#include "kiln/nn/batchnorm.hpp"
#include "kiln/nn/conv.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/named.hpp"
#include "kiln/nn/pool.hpp"
#include "kiln/nn/repeat.hpp"
#include "kiln/nn/reshape.hpp"
#include "kiln/nn/residual.hpp"
#include "kiln/nn/sequential.hpp"

namespace kiln::models {

// torchvision's conv1x1 / conv3x3: no bias (a BatchNorm follows).
template <index_t In, index_t Out, index_t Stride = 1>
using Conv1x1 = nn::Conv2d<In, Out, 1, Stride, 0, 1, false>;
template <index_t In, index_t Out, index_t Stride = 1>
using Conv3x3 = nn::Conv2d<In, Out, 3, Stride, 1, 1, false>;

// The shortcut of a block from In channels to Out at Stride: the identity (void) when the shape
// stays, else torchvision's "downsample": a 1x1 projection and its BatchNorm.
template <index_t In, index_t Out, index_t Stride>
using Shortcut =
    std::conditional_t<In == Out && Stride == 1, void,
                       nn::Named<"downsample", nn::Sequential<Conv1x1<In, Out, Stride>, nn::BatchNorm2d<Out>>>>;

// ResNet-18 / 34's block: two 3x3 convolutions.
template <index_t In, index_t Width, index_t Stride = 1>
struct BasicBlock {
  static constexpr index_t out_channels = Width;
  using type = nn::Residual<nn::Sequential<nn::Named<"conv1", Conv3x3<In, Width, Stride>>,
                                           nn::Named<"bn1", nn::BatchNorm2d<Width>>, nn::ReLU,
                                           nn::Named<"conv2", Conv3x3<Width, Width>>,
                                           nn::Named<"bn2", nn::BatchNorm2d<Width>>>,
                            Shortcut<In, Width, Stride>, nn::ReLU>;
};

// ResNet-50 / 101's block: 1x1 down to Width, 3x3 at Stride, 1x1 up to 4 x Width.
template <index_t In, index_t Width, index_t Stride = 1>
struct Bottleneck {
  static constexpr index_t out_channels = 4 * Width;
  using type = nn::Residual<nn::Sequential<nn::Named<"conv1", Conv1x1<In, Width>>,
                                           nn::Named<"bn1", nn::BatchNorm2d<Width>>, nn::ReLU,
                                           nn::Named<"conv2", Conv3x3<Width, Width, Stride>>,
                                           nn::Named<"bn2", nn::BatchNorm2d<Width>>, nn::ReLU,
                                           nn::Named<"conv3", Conv1x1<Width, 4 * Width>>,
                                           nn::Named<"bn3", nn::BatchNorm2d<4 * Width>>>,
                            Shortcut<In, 4 * Width, Stride>, nn::ReLU>;
};

// A stage of Blocks blocks of width Width from In channels, the first at Stride (torchvision's
// _make_layer): its first block takes the stride and the projection, the others are one type.
template <template <index_t, index_t, index_t> class Block, index_t Blocks, index_t In, index_t Width, index_t Stride>
using Stage = nn::Repeat<Blocks, typename Block<Block<In, Width, Stride>::out_channels, Width, 1>::type,
                         typename Block<In, Width, Stride>::type>;

// The channels a stage of Block at Width puts out.
template <template <index_t, index_t, index_t> class Block, index_t Width>
inline constexpr index_t stage_channels = Block<64, Width, 1>::out_channels;

template <template <index_t, index_t, index_t> class Block, index_t L1, index_t L2, index_t L3, index_t L4,
          index_t Classes, index_t Size>
using ResNet = nn::Sequential<
    nn::Unflatten<3, Size, Size>,                                                                    //
    nn::Named<"conv1", nn::Conv2d<3, 64, 7, 2, 3, 1, false>>, nn::Named<"bn1", nn::BatchNorm2d<64>>,  // stem
    nn::ReLU, nn::MaxPool2d<3, 2, 1>,                                                                //
    nn::Named<"layer1", Stage<Block, L1, 64, 64, 1>>,                                                //
    nn::Named<"layer2", Stage<Block, L2, stage_channels<Block, 64>, 128, 2>>,                        //
    nn::Named<"layer3", Stage<Block, L3, stage_channels<Block, 128>, 256, 2>>,                       //
    nn::Named<"layer4", Stage<Block, L4, stage_channels<Block, 256>, 512, 2>>,                       //
    nn::GlobalAvgPool, nn::Named<"fc", nn::Linear<stage_channels<Block, 512>, Classes>>>;            // head

template <index_t Classes = 1000, index_t Size = 224>
using ResNet18 = ResNet<BasicBlock, 2, 2, 2, 2, Classes, Size>;
template <index_t Classes = 1000, index_t Size = 224>
using ResNet34 = ResNet<BasicBlock, 3, 4, 6, 3, Classes, Size>;
template <index_t Classes = 1000, index_t Size = 224>
using ResNet50 = ResNet<Bottleneck, 3, 4, 6, 3, Classes, Size>;
template <index_t Classes = 1000, index_t Size = 224>
using ResNet101 = ResNet<Bottleneck, 3, 4, 23, 3, Classes, Size>;

}  // namespace kiln::models

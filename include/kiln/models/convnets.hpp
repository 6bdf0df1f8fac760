// kiln/models/convnets.hpp — the reference convolutional networks of the examples and benchmarks,
// as types (the counterpart of a torchvision model constructor; the same layers as the PyTorch
// peers in bench/torch_convnet.py, so the two train the same network):
//
//   DigitsCnn   20x20 grey digits: conv16-bn-relu-pool, conv32-bn-relu-pool, fc128, fc10
//               (examples/train_cnn_digits).
//   ResNet9<W>  32x32 RGB (CIFAR-10), the ResNet-9 of the DAWNBench / airbench line at width W
//               (W = 64 is the original; 32 by default, a quarter of its work, for CPUs):
//               prep conv(W) -> conv(2W) + pool -> residual of two conv(2W) -> conv(4W) + pool
//               -> conv(8W) + pool -> residual of two conv(8W) -> global average -> fc10,
//               every conv 3x3 with padding 1, followed by BatchNorm2d and ReLU
//               (examples/train_cifar).
#pragma once

#include "kiln/nn/activation.hpp"
#include "kiln/nn/batchnorm.hpp"
#include "kiln/nn/conv.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/pool.hpp"
#include "kiln/nn/reshape.hpp"
#include "kiln/nn/residual.hpp"
#include "kiln/nn/sequential.hpp"

namespace kiln::models {

using DigitsCnn = nn::Sequential<nn::Unflatten<1, 20, 20>,                                                    //
                                 nn::Conv2d<1, 16, 3, 1, 1>, nn::BatchNorm2d<16>, nn::ReLU, nn::MaxPool2d<2>,   //
                                 nn::Conv2d<16, 32, 3, 1, 1>, nn::BatchNorm2d<32>, nn::ReLU, nn::MaxPool2d<2>,  //
                                 nn::Flatten, nn::Linear<800, 128>, nn::ReLU, nn::Linear<128, 10>>;

// conv 3x3 (padding 1) -> BatchNorm2d -> ReLU, as a layer.
template <index_t In, index_t Out>
using ConvBnRelu = nn::Sequential<nn::Conv2d<In, Out, 3, 1, 1>, nn::BatchNorm2d<Out>, nn::ReLU>;

template <index_t W = 32>
using ResNet9 = nn::Sequential<nn::Unflatten<3, 32, 32>,                                                  //
                               ConvBnRelu<3, W>,                                                          //
                               ConvBnRelu<W, 2 * W>, nn::MaxPool2d<2>,                                    //
                               nn::Residual<nn::Sequential<ConvBnRelu<2 * W, 2 * W>, ConvBnRelu<2 * W, 2 * W>>>,  //
                               ConvBnRelu<2 * W, 4 * W>, nn::MaxPool2d<2>,                                //
                               ConvBnRelu<4 * W, 8 * W>, nn::MaxPool2d<2>,                                //
                               nn::Residual<nn::Sequential<ConvBnRelu<8 * W, 8 * W>, ConvBnRelu<8 * W, 8 * W>>>,  //
                               nn::GlobalAvgPool, nn::Linear<8 * W, 10>>;

}  // namespace kiln::models

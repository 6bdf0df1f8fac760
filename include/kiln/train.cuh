// kiln/train.cuh — kiln/train.hpp's CUDA half: include it (after or instead of <kiln/train.hpp>)
// from files compiled by nvcc to train models on a device: nn layers on kiln::cuda, the
// optimizers' multi-tensor kernels, the device loader and the loss scaler's kernels.
#pragma once

#include "kiln/cuda.cuh"
#include "kiln/data/device_loader.cuh"
#include "kiln/nn/cuda.cuh"
#include "kiln/optim/cuda_step.cuh"
#include "kiln/train.hpp"
#include "kiln/train/grad_scaler.cuh"

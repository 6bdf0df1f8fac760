// examples/finetune_resnet/steps.hpp — what finetune_resnet's files share: the model, and the
// functions that make its CPU training step in each precision (each in its own file, so the
// precisions compile in parallel) and measure its accuracy. The precision files include only this.
#pragma once

#include <string>

#include "kiln/data/dataset.hpp"
#include "kiln/models/resnet.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/train/select_step.hpp"

namespace finetune_resnet {

using kiln::index_t;
// torchvision's ResNet-50 at 224x224 with a head sized at run time (the folder's class count), channels-last:
// the layout kiln's CPU convolutions and batch norm run fastest in (inputs stay CHW rows; the
// weights and state_dict are torchvision's either way).
using Model = kiln::models::ResNet50<kiln::dyn, 224>::with_layout<kiln::nn::layout::nhwc>;
using Optimizer = kiln::optim::AdamW<kiln::host>;
using HostStep = kiln::train::AnyStep<Model, Optimizer, kiln::CpuExecutor>;

// The step of one precision (the fused stance, mode default; accumulation at run time).
HostStep make_step_float(const std::string& precision, Model& model, Optimizer& opt, kiln::CpuExecutor& exec,
                         kiln::train::StepOptions options);  // fp32 and tf32: step_float.cpp
HostStep make_step_bf16(Model& model, Optimizer& opt, kiln::CpuExecutor& exec,
                        kiln::train::StepOptions options);  // bf16_mixed: step_bf16.cpp

// The fraction of `dataset` the model classifies right, in eval mode (step_float.cpp, which
// compiles the float forward anyway).
double accuracy(Model& model, kiln::CpuExecutor& exec, const kiln::data::Dataset& dataset);

}  // namespace finetune_resnet

// kiln/train.hpp — everything a training program uses on top of kiln.hpp: layers, losses,
// optimizers and schedules, policies, the training step, its report, evaluation and the loader.
// CUDA programs include <kiln/cuda.cuh> as well (from files compiled by nvcc).
#pragma once

#include "kiln.hpp"
#include "kiln/data/batch_loader.hpp"
#include "kiln/data/csv.hpp"
#include "kiln/data/idx.hpp"
#include "kiln/data/normalize.hpp"
#include "kiln/nn/activation.hpp"
#include "kiln/nn/dropout.hpp"
#include "kiln/nn/layernorm.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/nn/opaque.hpp"
#include "kiln/nn/sequential.hpp"
#include "kiln/nn/softmax.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/optim/batch_scaling.hpp"
#include "kiln/optim/clip.hpp"
#include "kiln/optim/schedule.hpp"
#include "kiln/optim/sgd.hpp"
#include "kiln/policy/policy.hpp"
#include "kiln/policy/select.hpp"
#include "kiln/train/evaluate.hpp"
#include "kiln/train/launches.hpp"
#include "kiln/train/report.hpp"
#include "kiln/train/step.hpp"

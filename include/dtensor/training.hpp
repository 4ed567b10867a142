// dtensor/training.hpp — everything that trains a model, on top of dtensor/dtensor.hpp: ops
// with sharding rules, modules with backward, optimizers, data / tensor / sequence parallelism,
// checkpoints (save_training_state / load_training_state).
//
//   #include <dtensor/training.hpp>
//   using Model = dtensor::nn::GPT<float, dtensor::DeviceMesh<"dp", "tp">, dtensor::parallel::MegatronPlan<true>>;
//
// A separate umbrella so that code which only redistributes does not compile the modules.
#pragma once

#include "dtensor/checkpoint/training_state.hpp"
#include "dtensor/dtensor.hpp"
#include "dtensor/models/gpt.hpp"
#include "dtensor/models/gpt_config.hpp"
#include "dtensor/models/moe_gpt.hpp"
#include "dtensor/ops/all.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/optim/clip_grad.hpp"
#include "dtensor/optim/sgd.hpp"
#include "dtensor/parallel/context_grads.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "dtensor/parallel/tensor_parallel.hpp"
#include "dtensor/parallel/vocab_parallel.hpp"

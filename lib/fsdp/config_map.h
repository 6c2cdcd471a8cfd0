// From an Accelerate-style config to the engine's options and mesh shape.
#pragma once

#include "config/config.h"
#include "fsdp/options.h"

namespace fsdp {

struct FsdpPlan {
  FsdpOptions options;
  int replicate_size = 1;  // HSDP replicas (1: plain FSDP)
  int shard_size = 1;      // ranks one shard group spans
};

// mixed_precision bf16|fp16 -> param_dtype bf16|fp16 with fp32 reduction and fp32 master weights;
// the wrap policy, its classes and min_num_params, offload, activation checkpointing as named; the
// layout (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, FSDP2's reshard flag and parallelism_config) from
// config::effective_fsdp_layout. A config that is not FSDP runs as pure replication (shard size 1).
FsdpPlan fsdp_plan_from_config(const config::Config& config, c10::Device device);

}  // namespace fsdp

// What fully_shard needs to know: how to choose units, how to shard them, and in which dtypes.
// The engine's own options: the trainer fills them from an Accelerate config (train/run_config.h), a
// program directly.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/float8_gather.h"
#include "fsdp/shard_layout.h"

namespace fsdp {

class HostTransfer;  // fsdp/host_transfer.h

// FSDP2's MixedPrecisionPolicy: fp32 sharded master weights always; parameters are gathered and
// computed in param_dtype; gradients are reduced in reduce_dtype and accumulated in fp32.
struct MixedPrecisionPolicy {
  at::ScalarType param_dtype = at::kFloat;  // kFloat, kBFloat16 or kHalf
  at::ScalarType reduce_dtype = at::kFloat;
};

// What a model declares about itself, so that wrap policies can pick its units.
struct ModelTraits {
  // Class names TRANSFORMER_BASED_WRAP wraps when the config names none (Hugging Face's
  // _no_split_modules), e.g. {"LlamaDecoderLayer"}.
  std::vector<std::string> layer_classes;
  // Classes whose forward the model runs through fsdp::call (fsdp/unit_call.h): the only modules
  // that can become units, because only their forwards can gather and free parameters.
  std::vector<std::string> unit_classes;
  // Classes TRANSFORMER_BASED_WRAP makes units besides the layer classes, whichever are named (Gemma 4
  // E2B/E4B's per-layer table, which would otherwise stay gathered in the root through the step).
  std::vector<std::string> separate_units = {};
};

// Which modules become units: the layer classes, modules holding enough parameters, or none (one
// root unit). The engine's own names for Accelerate's fsdp_auto_wrap_policy values.
enum class WrapPolicy { kTransformerBasedWrap, kSizeBasedWrap, kNoWrap };

struct FsdpOptions {
  WrapPolicy wrap_policy = WrapPolicy::kTransformerBasedWrap;
  std::vector<std::string> layer_classes;  // TRANSFORMER_BASED_WRAP; empty: ModelTraits::layer_classes
  int64_t min_num_params = 100000000;      // SIZE_BASED_WRAP
  bool reshard_after_forward = true;       // false: ZeRO-2 (one all-gather per step per unit)
  MixedPrecisionPolicy mixed_precision;
  bool offload_params = false;            // shards, gradients and optimizer state in host memory
  // With offload_params: the copies between host and device (fsdp/host_transfer.h). Null: the
  // device's own upload and download streams off the CPU, plain copies on it; tests set one.
  std::shared_ptr<HostTransfer> host_transfer;
  // With offload_params and a host_transfer: each unit's shard stays on the device in param_dtype
  // (2 bytes a parameter over the shard group in bf16) from its upload until its next update, so
  // backward's gather and every accumulated micro-batch's find it there instead of uploading the
  // fp32 shard again; false: each gather uploads (FSDP2's CPUOffloadPolicy does).
  bool offload_keep_on_device = true;
  bool activation_checkpointing = false;  // recompute each innermost unit's forward in backward
  bool prefetch = true;                   // issue the next unit's all-gather before this one computes
  c10::Device device = c10::kCPU;         // where units compute
  bool host_cache = true;                 // on the CPU, fsdp/host_cache.h's allocator (installed first)
  bool record_events = false;             // keep the gather/free/reduce log (tests)
  // FSDP2's ignored_params, chosen as Accelerate's fsdp_ignored_modules does: a regex full-matched
  // against module paths ("model.layers.0.mlp"). Every parameter under a matching module is left
  // alone: not sharded, never gathered or reduced, its gradient local to each rank and not stepped
  // by ShardedAdamW; it only moves to `device`. "" = none.
  std::string ignored_modules;
  // When set, each parameter's full fp32 value is created by init(name, shape) at the moment its
  // unit is sharded, one parameter at a time, and the module's own values are not read (their
  // storage may already be freed): the whole model never exists on one rank.
  std::function<at::Tensor(const std::string& name, at::IntArrayRef shape)> init;
  // Optional beside init: values [begin, begin + count) of init(name, shape) flattened (a 1-D fp32
  // tensor), made without the rest, so each rank makes only its shard's rows of a parameter that
  // tensor parallel does not split (those still come from init). Must equal init's values there.
  std::function<at::Tensor(const std::string& name, at::IntArrayRef shape, int64_t begin, int64_t count)> init_range;
  // Tensor parallel (the mesh's tp group): how a parameter's registered tensor is this rank's
  // block of the whole one (fsdp/shard_layout.h's TpSlice: its dim, and its whole size along dim
  // when the blocks pad it; the engine fills in index and parts), or dim -1 for one every tp rank
  // holds whole. init then makes the whole value and keeps the block; gathers return whole values;
  // the gradients of the whole ones are summed over the tp group after each reducing backward.
  // Unset: every parameter whole.
  std::function<TpSlice(const std::string& name)> tensor_parallel;
  // Expert parallel (the mesh's ep and experts): every module of these classes (the stacked experts
  // of a mixture-of-experts layer, which must be unit classes) becomes a unit of its own over the
  // experts' mesh, holding this ep rank's block of experts. Empty: none.
  std::vector<std::string> expert_classes;
  // Float8 all-gather (fsdp/float8_gather.h): the weights it names travel in float8 where a unit is
  // gathered over more than one rank and not offloaded. Unset: every parameter in param_dtype.
  Float8GatherOptions float8_gather;
  // Frozen parameters held and gathered in fp32 whatever param_dtype (transformers'
  // _keep_in_fp32_modules_strict: DeepSeek-V3's and GLM-4.5's router bias, which it keeps in fp32 in a
  // bf16 model): their shards hold the fp32 values and their gathers carry those bits unrounded, so
  // the forward reads, and exports write, the stored values. A trainable parameter it names is
  // gathered in param_dtype as any other. Unset: none.
  std::function<bool(const std::string& name)> keep_in_fp32;
};

}  // namespace fsdp

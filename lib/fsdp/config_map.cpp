#include "fsdp/config_map.h"

#include "config/config.h"

namespace fsdp {

FsdpPlan fsdp_plan_from_config(const config::Config& config, c10::Device device) {
  FsdpPlan plan;
  FsdpOptions& o = plan.options;
  switch (config.launch.mixed_precision) {
    case config::MixedPrecision::kNo:
      break;
    case config::MixedPrecision::kBf16:
      o.mixed_precision.param_dtype = at::kBFloat16;
      break;
    case config::MixedPrecision::kFp16:
      o.mixed_precision.param_dtype = at::kHalf;
      break;
  }
  o.mixed_precision.reduce_dtype = at::kFloat;
  switch (config.fsdp.auto_wrap_policy) {
    case config::WrapPolicy::kTransformerBasedWrap:
      o.wrap_policy = WrapPolicy::kTransformerBasedWrap;
      break;
    case config::WrapPolicy::kSizeBasedWrap:
      o.wrap_policy = WrapPolicy::kSizeBasedWrap;
      break;
    case config::WrapPolicy::kNoWrap:
      o.wrap_policy = WrapPolicy::kNoWrap;
      break;
  }
  o.layer_classes = config.fsdp.transformer_layer_cls_to_wrap;
  o.ignored_modules = config.fsdp.ignored_modules;
  o.min_num_params = config.fsdp.min_num_params;
  o.offload_params = config.fsdp.offload_params;
  o.activation_checkpointing = config.fsdp.activation_checkpointing;
  o.device = device;
  const config::FsdpLayout layout = config::effective_fsdp_layout(config);
  o.reshard_after_forward = layout.reshard_after_forward;
  plan.replicate_size = layout.replicate_size;
  plan.shard_size = layout.shard_size;
  return plan;
}

}  // namespace fsdp

// The trainer's reading of an Accelerate config: the FSDP plan the engine gets, the schedule.
#include "train/run_config.h"

#include <doctest/doctest.h>

#include "config/loader.h"

using namespace fsdp;
using namespace fsdp::train;

namespace {

config::Config config_of(const std::string& yaml) {
  config::ConfigInputs in;
  in.text = yaml;
  in.has_file = true;
  in.file = "test.yaml";
  return config::load_config_or_throw(in).typed;
}

}  // namespace

TEST_CASE("Accelerate configs map onto the engine") {
  auto plan_of = [](const std::string& yaml) { return fsdp_plan_from_config(config_of(yaml), c10::kCPU); };
  const FsdpPlan hybrid = plan_of(
      "distributed_type: FSDP\nnum_processes: 4\nmixed_precision: bf16\nfsdp_config:\n  fsdp_version: 1\n"
      "  fsdp_sharding_strategy: HYBRID_SHARD\n  fsdp_offload_params: true\n  fsdp_activation_checkpointing: true\n"
      "num_machines: 2\nmain_process_ip: 10.0.0.1\n");
  CHECK(static_cast<int>(hybrid.options.mixed_precision.param_dtype) == static_cast<int>(at::kBFloat16));
  CHECK(static_cast<int>(hybrid.options.mixed_precision.reduce_dtype) == static_cast<int>(at::kFloat));
  CHECK(hybrid.options.offload_params);
  CHECK(hybrid.options.activation_checkpointing);
  CHECK(hybrid.options.reshard_after_forward);
  CHECK(hybrid.replicate_size == 2);
  CHECK(hybrid.shard_size == 2);
  const FsdpPlan zero2 = plan_of(
      "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n"
      "  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 1000\n");
  CHECK(!zero2.options.reshard_after_forward);
  CHECK(zero2.options.wrap_policy == fsdp::WrapPolicy::kSizeBasedWrap);
  CHECK(zero2.options.min_num_params == 1000);
  CHECK(zero2.replicate_size == 1);
  CHECK(zero2.shard_size == 2);
}

TEST_CASE("schedule keys become the optimizer's schedule") {
  const optim::ScheduleOptions s =
      schedule_of(config_of("distributed_type: FSDP\nnum_processes: 2\nschedule:\n  type: linear\n  warmup_steps: 4\n"
                            "  min_lr_ratio: 0.5\n"));
  CHECK(s.decay == optim::Decay::kLinear);
  CHECK(s.warmup_steps == 4);
  CHECK(s.min_lr_ratio == 0.5);
  CHECK(optim::learning_rate(s, 1.0, 2, 10) == doctest::Approx(0.5));   // warming up
  CHECK(optim::learning_rate(s, 1.0, 10, 10) == doctest::Approx(0.5));  // the end: lr * min_lr_ratio
  CHECK(optim::learning_rate(s, 1.0, 7, 10) == doctest::Approx(0.75));  // halfway down the linear decay
}

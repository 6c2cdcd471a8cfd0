// Float8 all-gather (torchao's enable_fsdp_float8_all_gather; fsdptrain's engine.float8_all_gather
// under engine.float8: tensorwise): a unit's weights that the model multiplies only in float8, with
// one scale a tensor, travel in float8_e4m3fn, half of bf16's bytes, and are never made in
// param_dtype on the device.
//   1. The scale is the whole weight's: each rank takes the largest magnitude of its rows in
//      param_dtype (the values the gathered weight would hold), and one all-reduce (max) over the
//      shard group gives the whole weights', for every unit's at once at the step's first forward
//      (ShardedModel; TorchTitan's precompute_float8_dynamic_scale_for_fsdp). They are kept until
//      the shards change (the next update), so backward's gathers and every accumulated
//      micro-batch's reuse them.
//   2. Each rank casts its rows with that scale into its slot of the gather, which then holds bytes:
//      [the unit's other parameters in param_dtype | its float8 weights].
//   3. While the unit is gathered, gathered_float8(weight) gives the whole weight's float8 bits and
//      inverse scale; the weight itself (the module's leaf, which autograd gives the gradient)
//      holds no bytes, so reading it otherwise fails ("its data is not allocated").
// The bits equal those the product would cast from the gathered param_dtype weight: the largest
// magnitude of param_dtype values is the same whether taken over the whole or as the max over the
// rows' shares, and the cast is elementwise with that one scale.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

namespace fsdp {

struct Float8GatherOptions {
  // Whether the parameter `name` travels in float8: a 2-D weight only float8 products read.
  std::function<bool(const std::string& name)> gathers;
  // x (one rank's rows of a weight, param_dtype, 2-D) cast with the scale of `amax` (a () fp32 tensor:
  // the whole weight's largest magnitude) into `bits` (float8_e4m3fn, x's shape); returns the ()
  // fp32 inverse scale the product multiplies by (the model's tensorwise arithmetic).
  std::function<at::Tensor(const at::Tensor& bits, const at::Tensor& x, const at::Tensor& amax)> cast;

  bool enabled() const { return gathers && cast; }
};

struct GatheredFloat8 {
  at::Tensor bits;     // the whole weight, float8_e4m3fn, row-major
  at::Tensor inverse;  // () fp32
};

// While its unit is gathered, the float8 value of a weight gathered in float8 (looked up by the
// module's parameter itself); nullopt for any other tensor, and once the unit is resharded.
std::optional<GatheredFloat8> gathered_float8(const at::Tensor& parameter);
// How many weights have a gathered float8 value now (none once every unit is resharded).
size_t gathered_float8_count();

// ParamGroup's: what a gather made, and its end.
void hold_gathered_float8(const at::Tensor& parameter, GatheredFloat8 value);
void drop_gathered_float8(const at::Tensor& parameter);

}  // namespace fsdp

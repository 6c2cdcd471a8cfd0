// fully_shard: FSDP2-style sharded training of a LibTorch module tree.
//
//   auto sharded = fsdp::fully_shard(model, traits, mesh, options);   // collective
//   for each micro-batch:
//     at::Tensor loss = sharded->forward({x}, [&](auto in) { return {model->loss(in[0], y)}; })[0];
//     loss.backward();                                                   // gathers and reduces
//   optimizer.step();  (fsdp::ShardedAdamW over sharded->groups())
//
// Units. The wrap policy picks modules of the tree (fsdp/options.h); each becomes a ParamGroup
// that owns the parameters under it not claimed by a deeper unit. Parameters outside every unit
// form the root unit, whose forward is the whole model's (ShardedModel::forward). A tied parameter
// used by modules of different units belongs to the root. C++ modules have no forward hooks, so the
// model runs each wrappable module through fsdp::call (fsdp/unit_call.h); that is where a unit's
// forward goes through the engine's pre-forward and post-forward.
//
// One step, per unit, as FSDP2's hooks: pre-forward gathers it (waiting for the prefetch issued by
// the unit before), issues the next unit's gather, casts the inputs and wraps them in the
// post-backward function; post-forward frees it (reshard_after_forward, non-root units) and puts a
// hook on its outputs, which re-gathers it at the start of its backward and prefetches the unit
// before it; the post-backward function runs post_backward (free, reduce-scatter) once its
// gradients are complete; a callback queued on the autograd engine reduces what is left (units
// whose inputs needed no gradient, the root) and waits for every reduction.
//
// Ownership: the ShardedModel does not own the module; the module and the process groups must
// outlive it, and it must outlive every autograd graph its forward built (their hooks point at it).
// Collective: construction, forward/backward and gather_full_state are collective over the mesh.
// Not thread-safe. At most one ShardedModel per module.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "fsdp/device_mesh.h"
#include "fsdp/options.h"
#include "fsdp/param_group.h"
#include "fsdp/unit_call.h"

namespace fsdp {

// Bytes one rank holds between steps.
struct PersistentBytes {
  int64_t params = 0;  // fp32 sharded master weights, padding included
  int64_t grads = 0;   // fp32 sharded gradients
  int64_t total() const { return params + grads; }
};

class ShardedModel {
 public:
  ShardedModel(torch::nn::Module& model, const ModelTraits& traits, DeviceMesh mesh, FsdpOptions options);
  ~ShardedModel();
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  // Runs `fn` (the model's whole forward, and the loss when wanted) as the root unit.
  TensorList forward(const TensorList& inputs, const UnitFn& fn);

  // false: backward keeps gradients unsharded, accumulated in fp32, and reduces nothing (no-sync
  // micro-batches); true (default): every backward reduce-scatters, sharded gradients accumulate.
  void set_requires_gradient_sync(bool sync) { sync_ = sync; }
  void zero_grad();

  // Units in registration order; groups()[0] is the root.
  const std::vector<std::unique_ptr<ParamGroup>>& groups() const { return groups_; }
  const DeviceMesh& mesh() const { return mesh_; }
  const FsdpOptions& options() const { return options_; }
  PersistentBytes persistent_bytes() const;

  // Every parameter's full fp32 value by name (collective over the shard group).
  std::vector<std::pair<std::string, at::Tensor>> gather_full_state() const;
  // Every trainable parameter's full fp32 sharded gradient by name (collective; tests, debugging).
  std::vector<std::pair<std::string, at::Tensor>> gather_full_gradients() const;

  // The parameters of options.ignored_modules, by name: full values on every rank, untouched.
  const std::vector<std::pair<std::string, at::Tensor>>& ignored_params() const { return ignored_; }

  // "gather X", "free X", "reduce X" in the order they happened (options.record_events).
  const std::vector<std::string>& events() const { return events_; }

 private:
  // A unit's forward (fsdp::call reaches it through the unit registry): pre_forward, fn, post_forward.
  TensorList run_unit(size_t unit, const TensorList& inputs, const UnitFn& fn);
  // FSDP2's pre-forward: order, gather, prefetch, cast, post-backward registration; the inputs fn gets.
  TensorList pre_forward(size_t unit, const TensorList& inputs);
  // FSDP2's post-forward: reshard, pre-backward hooks on the outputs.
  void post_forward(size_t unit, const TensorList& outputs);
  void pre_backward(size_t unit);
  void post_backward(size_t unit);

  void prefetch_after(size_t unit, const std::vector<size_t>& order);
  void precompute_float8_scales();  // at a step's first forward: one all-reduce for every unit's
  void finish_backward();

  DeviceMesh mesh_;
  FsdpOptions options_;
  std::vector<std::unique_ptr<ParamGroup>> groups_;
  std::vector<std::pair<std::string, at::Tensor>> ignored_;
  std::vector<const torch::nn::Module*> unit_modules_;  // by unit; [0] is the model
  std::vector<bool> leaf_unit_;                         // no unit nested inside
  std::vector<std::string> events_;

  // Per step.
  bool sync_ = true;
  bool callback_queued_ = false;
  std::vector<size_t> forward_order_;       // pre-forward order this step
  std::vector<size_t> last_forward_order_;  // previous step's; prefetch follows it
  std::vector<size_t> registration_order_;  // the first step's guess
  std::vector<size_t> post_forward_order_;  // backward prefetch walks it in reverse
  std::vector<bool> backward_started_, backward_done_;
  std::vector<size_t> reduce_queue_;  // units with a reduce-scatter in flight, oldest first
};

// The units the options' wrap policy makes of `model`, root first, with the parameters each will
// own (a tied parameter once, its other names in aliases). Reads only the tree and the parameters'
// shapes: what fully_shard shards, and what estimate-memory counts. Throws as fully_shard does.
struct UnitPlan {
  std::string path;  // "" for the root
  const torch::nn::Module* module = nullptr;
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<std::vector<std::string>> aliases;
};
// ignored (optional): receives the parameters options.ignored_modules leaves out of every unit.
std::vector<UnitPlan> plan_units(torch::nn::Module& model, const ModelTraits& traits, const FsdpOptions& options,
                                 std::vector<std::pair<std::string, at::Tensor>>* ignored = nullptr);

// Shards `model` by the options' wrap policy. Throws InputError for a wrap class the model does
// not have (listing the ones it has) or one it cannot run as a unit. Collective over the mesh.
// On the CPU it first installs the host block cache (fsdp/host_cache.h) as LibTorch's CPU allocator,
// unless options.host_cache is false.
std::unique_ptr<ShardedModel> fully_shard(torch::nn::Module& model, const ModelTraits& traits, DeviceMesh mesh,
                                          FsdpOptions options);

}  // namespace fsdp

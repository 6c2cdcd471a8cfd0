#include "fsdp/fully_shard.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "fsdp/autograd_hooks.h"
#include "fsdp/host_cache.h"
#include "fsdp/host_transfer.h"
#include "fsdp/set_data.h"
#include "fsdp/unit_call.h"
#include "util/error.h"
#include "util/regex.h"
#include "util/strings.h"

namespace fsdp {

namespace {

// "blocks.0" contains "blocks.0.fc1" and itself; "" (the root) contains everything.
bool path_contains(const std::string& outer, const std::string& inner) {
  if (outer.empty() || outer == inner) return true;
  return inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 && inner[outer.size()] == '.';
}

std::string module_path_of(const std::string& param_name) {
  const size_t dot = param_name.rfind('.');
  return dot == std::string::npos ? "" : param_name.substr(0, dot);
}

std::string join_sorted(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Modules the wrap policy makes units, by path (pre-order, the order forward visits them).
std::vector<std::string> policy_units(
    const torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>& modules, const ModelTraits& traits,
    const FsdpOptions& options) {
  std::set<std::string> classes, unit_classes(traits.unit_classes.begin(), traits.unit_classes.end());
  for (const auto& item : modules) classes.insert(module_class_name(*item.value()));
  std::vector<std::string> chosen;
  switch (options.wrap_policy) {
    case WrapPolicy::kNoWrap:
      return chosen;
    case WrapPolicy::kTransformerBasedWrap: {
      const std::vector<std::string>& wanted =
          options.layer_classes.empty() ? traits.layer_classes : options.layer_classes;
      FSDP_CHECK(!wanted.empty(),
                 "[fsdp] fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP needs fsdp_transformer_layer_cls_to_wrap, and "
                 "this model declares no layer class; name one of: ",
                 join_sorted(unit_classes));
      for (const std::string& w : wanted) {
        FSDP_CHECK(classes.count(w), "[fsdp] fsdp_transformer_layer_cls_to_wrap: the model has no class ", quoted(w),
                   "; its classes are: ", join_sorted(classes));
        FSDP_CHECK(unit_classes.count(w), "[fsdp] fsdp_transformer_layer_cls_to_wrap: ", quoted(w),
                   " runs inside another module's forward and cannot be a unit; classes that can: ",
                   join_sorted(unit_classes));
      }
      const std::vector<std::string>& separate = traits.separate_units;
      for (const std::string& s : separate)
        FSDP_ASSERT(unit_classes.count(s), s, " is kept apart as a unit but is not run through fsdp::call");
      for (const auto& item : modules) {
        const std::string cls = module_class_name(*item.value());
        if (std::find(wanted.begin(), wanted.end(), cls) != wanted.end() ||
            std::find(separate.begin(), separate.end(), cls) != separate.end())
          chosen.push_back(item.key());
      }
      return chosen;
    }
    case WrapPolicy::kSizeBasedWrap: {
      // Children before parents (reverse pre-order), as torch's size_based_auto_wrap_policy: a module
      // becomes a unit when the parameters under it that no deeper unit took reach min_num_params.
      std::set<const at::TensorImpl*> claimed;
      std::set<std::string> picked;
      for (auto it = modules.items().rbegin(); it != modules.items().rend(); ++it) {
        const std::string& path = it->key();
        const std::shared_ptr<torch::nn::Module>& module = it->value();
        if (!unit_classes.count(module_class_name(*module))) continue;
        int64_t count = 0;
        std::vector<const at::TensorImpl*> mine;
        for (const auto& p : module->named_parameters(/*recurse=*/true)) {
          const at::TensorImpl* impl = p.value().unsafeGetTensorImpl();
          if (claimed.count(impl) || std::find(mine.begin(), mine.end(), impl) != mine.end()) continue;
          mine.push_back(impl);
          count += p.value().numel();
        }
        if (count >= options.min_num_params && count > 0) {
          picked.insert(path);
          claimed.insert(mine.begin(), mine.end());
        }
      }
      for (const auto& item : modules)
        if (picked.count(item.key())) chosen.push_back(item.key());
      return chosen;
    }
  }
  return chosen;
}

// The wrap policy's units, and with expert parallel every module of an expert class, in pre-order.
std::vector<std::string> choose_units(
    const torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>& modules, const ModelTraits& traits,
    const FsdpOptions& options) {
  std::vector<std::string> chosen = policy_units(modules, traits, options);
  if (options.expert_classes.empty()) return chosen;
  const std::set<std::string> units(chosen.begin(), chosen.end());
  const std::set<std::string> unit_classes(traits.unit_classes.begin(), traits.unit_classes.end());
  std::vector<std::string> out;
  for (const auto& item : modules) {
    const std::string cls = module_class_name(*item.value());
    const bool expert =
        std::find(options.expert_classes.begin(), options.expert_classes.end(), cls) != options.expert_classes.end();
    FSDP_CHECK(!expert || unit_classes.count(cls), "[fsdp] expert parallel: ", cls,
               " runs inside another module's forward and cannot be a unit of its own");
    if (units.count(item.key()) || expert) out.push_back(item.key());
  }
  return out;
}

}  // namespace

DeviceMesh make_mesh(const dist::ProcessGroup& world, int replicate_size, int data_shard_size, int post_forward_size,
                     int tp_size, int cp_size, int ep_size) {
  FSDP_CHECK(replicate_size >= 1 && data_shard_size >= 1 && tp_size >= 1 && cp_size >= 1 &&
                 1LL * replicate_size * data_shard_size * cp_size * tp_size == world.size(),
             "[fsdp] parallelism_config: dp_replicate_size ", replicate_size, " x dp_shard_size ", data_shard_size,
             cp_size > 1 ? str(" x cp_size ", cp_size) : std::string(), " x tp_size ", tp_size,
             " must equal the number of processes, ", world.size());
  const int shard_size = data_shard_size * cp_size;  // FSDP shards over dp_shard x cp
  FSDP_CHECK(post_forward_size == 0 || (post_forward_size >= 1 && shard_size % post_forward_size == 0),
             "[fsdp] fsdp_reshard_after_forward: ", post_forward_size, " must divide the shard group's size, ",
             shard_size);
  DeviceMesh mesh(world);
  const int t = world.rank() % tp_size, dp = world.rank() / tp_size;  // tp innermost
  const int replica = dp / shard_size, index = dp % shard_size;
  auto world_rank = [&](int r, int s) { return (r * shard_size + s) * tp_size + t; };
  // Every rank makes its groups in this order (tp, cp, shard, replicate, post-forward), so each
  // one's k-th new_group is the same group as its fellow members' k-th.
  if (tp_size > 1) {
    std::vector<int> ranks;
    for (int i = 0; i < tp_size; ++i) ranks.push_back(dp * tp_size + i);
    mesh.tp = world.new_group(ranks);
  }
  if (cp_size > 1) {  // the cp_size consecutive members of the shard group that share a data shard
    std::vector<int> ranks;
    for (int i = 0; i < cp_size; ++i) ranks.push_back(world_rank(replica, index / cp_size * cp_size + i));
    mesh.cp = world.new_group(ranks, /*own=*/true);  // its bytes counted apart from FSDP's
  }
  if (replicate_size > 1 || tp_size > 1) {
    std::vector<int> shard_ranks, replicate_ranks;
    for (int i = 0; i < shard_size; ++i) shard_ranks.push_back(world_rank(replica, i));
    mesh.shard = world.new_group(shard_ranks);
    if (replicate_size > 1) {
      for (int j = 0; j < replicate_size; ++j) replicate_ranks.push_back(world_rank(j, index));
      mesh.replicate = world.new_group(replicate_ranks);
    }
  }
  // 1 would keep everything gathered (reshard_after_forward: false) and shard_size resharding whole.
  if (post_forward_size > 1 && post_forward_size < shard_size) {
    std::vector<int> ranks;
    const int first = index / post_forward_size * post_forward_size;
    for (int i = 0; i < post_forward_size; ++i) ranks.push_back(world_rank(replica, first + i));
    mesh.post_forward = world.new_group(ranks);
  }
  if (ep_size > 1) {
    FSDP_CHECK(shard_size % ep_size == 0, "[fsdp] parallelism_config_ep_size ", ep_size,
               " must divide the shard group (dp_shard_size x cp_size = ", shard_size, ")");
    std::vector<int> ep_ranks, expert_shard_ranks;
    for (int i = 0; i < ep_size; ++i) ep_ranks.push_back(world_rank(replica, index / ep_size * ep_size + i));
    for (int j = 0; j < shard_size / ep_size; ++j)
      expert_shard_ranks.push_back(world_rank(replica, j * ep_size + index % ep_size));
    mesh.ep = world.new_group(ep_ranks, /*own=*/true);  // its bytes counted apart from FSDP's
    mesh.experts = std::make_shared<DeviceMesh>(world.new_group(expert_shard_ranks), mesh.replicate);
    mesh.experts->ep = mesh.ep;
    mesh.experts->tp = mesh.tp;  // each tp rank routes its own sequence block through whole experts
    mesh.experts->expert_blocks = true;
  }
  return mesh;
}

namespace {

// The parameters under modules whose path full-matches options.ignored_modules.
std::set<const at::TensorImpl*> ignored_tensors(
    const torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>& modules, const FsdpOptions& options) {
  std::set<const at::TensorImpl*> out;
  if (options.ignored_modules.empty()) return out;
  const Regex pattern(options.ignored_modules, "fsdp_config.fsdp_ignored_modules");
  for (const auto& item : modules)
    if (pattern.full_match(item.key()))
      for (const auto& p : item.value()->parameters(/*recurse=*/true)) out.insert(p.unsafeGetTensorImpl());
  return out;
}

}  // namespace

std::vector<UnitPlan> plan_units(torch::nn::Module& model, const ModelTraits& traits, const FsdpOptions& options,
                                 std::vector<std::pair<std::string, at::Tensor>>* ignored) {
  const auto modules = model.named_modules("", /*include_self=*/false);
  const std::vector<std::string> units = choose_units(modules, traits, options);
  const std::set<const at::TensorImpl*> left_alone = ignored_tensors(modules, options);

  // Each distinct parameter (a tied one is registered under several names) goes to the deepest unit
  // containing every module that registers it; the root when none does.
  struct Found {
    std::string name;
    at::Tensor tensor;
    std::vector<std::string> aliases;
    std::string unit;
  };
  std::vector<Found> found;
  std::unordered_map<const at::TensorImpl*, size_t> index;
  auto deepest_unit = [&](const std::string& module_path) {
    std::string best;
    bool any = false;
    for (const std::string& u : units)
      if (path_contains(u, module_path) && (!any || u.size() > best.size())) best = u, any = true;
    return best;
  };
  std::set<const at::TensorImpl*> ignored_seen;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    const at::TensorImpl* impl = p.value().unsafeGetTensorImpl();
    if (left_alone.count(impl)) {
      if (ignored && ignored_seen.insert(impl).second) ignored->emplace_back(p.key(), p.value());
      continue;
    }
    const std::string unit = deepest_unit(module_path_of(p.key()));
    auto it = index.find(impl);
    if (it == index.end()) {
      index[impl] = found.size();
      found.push_back(Found{p.key(), p.value(), {}, unit});
    } else {
      Found& f = found[it->second];
      if (p.key() != f.name) f.aliases.push_back(p.key());
      if (f.unit != unit) f.unit = "";  // tied across units: the root owns it
    }
  }

  std::vector<std::string> paths{""};
  for (const std::string& u : units) paths.push_back(u);
  std::vector<UnitPlan> plans;
  for (const std::string& path : paths) {
    UnitPlan plan;
    plan.path = path;
    plan.module = path.empty() ? &model : modules[path].get();
    for (const Found& f : found) {
      if (f.unit != path) continue;
      plan.params.emplace_back(f.name, f.tensor);
      plan.aliases.push_back(f.aliases);
    }
    if (!path.empty() && plan.params.empty()) continue;  // everything under it went elsewhere: not a unit
    plans.push_back(std::move(plan));
  }
  return plans;
}

ShardedModel::ShardedModel(torch::nn::Module& model, const ModelTraits& traits, DeviceMesh mesh, FsdpOptions options)
    : mesh_(std::move(mesh)), options_(std::move(options)) {
  // Offloaded units go up and their gradients come down on streams of their own, shared by every
  // unit, so the copies overlap compute (fsdp/host_transfer.h).
  if (options_.offload_params && !options_.device.is_cpu() && !options_.host_transfer)
    options_.host_transfer = make_stream_transfer(options_.device);
  auto shared_mesh = std::make_shared<DeviceMesh>(mesh_);
  ParamGroup::EventLog log;
  if (options_.record_events) log = [this](const std::string& e) { events_.push_back(e); };
  std::vector<UnitPlan> plans = plan_units(model, traits, options_, &ignored_);
  for (const UnitPlan& plan : plans)
    if (!plan.path.empty()) check_unregistered(plan.module);
  const std::vector<std::string>& experts = options_.expert_classes;
  for (UnitPlan& plan : plans) {
    // Expert parallel: the experts' units shard over the experts' mesh, each rank its ep block.
    const bool expert = !plan.path.empty() &&
                        std::find(experts.begin(), experts.end(), module_class_name(*plan.module)) != experts.end();
    FSDP_CHECK(!expert || mesh_.experts, "[fsdp] expert_classes without an expert-parallel mesh (make_mesh's ep_size)");
    groups_.push_back(std::make_unique<ParamGroup>(plan.path, std::move(plan.params), std::move(plan.aliases),
                                                   expert ? mesh_.experts : shared_mesh, options_, log));
    unit_modules_.push_back(plan.module);
  }
  for (size_t u = 0; u < groups_.size(); ++u) {
    bool leaf = true;
    for (size_t v = 1; v < groups_.size(); ++v)
      if (v != u && path_contains(groups_[u]->name(), groups_[v]->name())) leaf = false;
    leaf_unit_.push_back(leaf);
    if (u > 0)
      register_unit(unit_modules_[u], this,
                    [this, u](const TensorList& in, const UnitFn& fn) { return run_unit(u, in, fn); });
  }
  for (size_t u = 0; u < groups_.size(); ++u) registration_order_.push_back(u);
  backward_started_.assign(groups_.size(), false);
  backward_done_.assign(groups_.size(), false);
  c10::NoGradGuard no_grad;
  for (auto& [name, p] : ignored_)  // left alone, but where the units compute
    if (p.device() != options_.device) set_data_any_device(p, p.detach().to(options_.device));
  // Buffers (rotary frequencies) too: a forward never copies one from the host, which would wait.
  for (at::Tensor& b : model.buffers())
    if (b.device() != options_.device) set_data_any_device(b, b.to(options_.device));
}

ShardedModel::~ShardedModel() {
  unregister_units(this);
}

TensorList ShardedModel::forward(const TensorList& inputs, const UnitFn& fn) {
  return run_unit(0, inputs, fn);
}

// Float8 all-gather: the scales of every unit's float8 weights in one all-reduce a step (TorchTitan's
// precompute_float8_dynamic_scale_for_fsdp), before any gather of the step needs them. Units with
// float8 weights are never expert units, so they share one shard group.
void ShardedModel::precompute_float8_scales() {
  std::vector<ParamGroup*> stale;
  std::vector<at::Tensor> parts;
  for (auto& g : groups_)
    if (!g->float8_scales_current()) {
      FSDP_ASSERT(stale.empty() || &g->mesh() == &stale.front()->mesh(), "[fsdp] float8 units over two meshes");
      stale.push_back(g.get());
      parts.push_back(g->float8_local_amaxes());
    }
  if (stale.empty()) return;
  c10::NoGradGuard no_grad;
  const at::Tensor all = at::cat(parts);
  dist::ProcessGroup shard = stale.front()->mesh().shard;
  shard.all_reduce(all, dist::ReduceOp::kMax, "float8 scales").wait();
  int64_t at = 0;
  for (size_t i = 0; i < stale.size(); ++i) {
    stale[i]->set_float8_amaxes(all.narrow(0, at, parts[i].numel()));
    at += parts[i].numel();
  }
}

TensorList ShardedModel::run_unit(size_t unit, const TensorList& inputs, const UnitFn& fn) {
  const TensorList in = pre_forward(unit, inputs);
  // Activation checkpointing recomputes innermost units only: an outer one's recomputation would
  // run the inner units' hooks a second time.
  const bool checkpointed =
      c10::GradMode::is_enabled() && options_.activation_checkpointing && unit != 0 && leaf_unit_[unit];
  TensorList out = checkpointed ? detail::checkpoint(fn, in, groups_[unit]->has_trainable()) : fn(in);
  post_forward(unit, out);
  return out;
}

TensorList ShardedModel::pre_forward(size_t unit, const TensorList& inputs) {
  if (unit == 0) {  // the root's forward is the whole model's: a new step
    forward_order_.clear();
    post_forward_order_.clear();
    // A post-forward share whose backward never ran may predate an optimizer step: gather afresh.
    for (auto& g : groups_)
      if (g->state() == GroupState::kPartial) g->reshard();
    precompute_float8_scales();
  }
  forward_order_.push_back(unit);
  groups_[unit]->wait_for_unshard();
  if (options_.prefetch) {  // the next unit in last step's order (the first step: registration order)
    prefetch_after(unit, last_forward_order_.empty() ? registration_order_ : last_forward_order_);
  }
  // Floating inputs are cast to the compute dtype (FSDP2's cast_forward_inputs).
  TensorList in = inputs;
  const at::ScalarType compute = options_.mixed_precision.param_dtype;
  for (at::Tensor& t : in)
    if (t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != compute) t = t.to(compute);
  if (c10::GradMode::is_enabled()) in = detail::register_post_backward([this, unit] { post_backward(unit); }, in);
  return in;
}

void ShardedModel::post_forward(size_t unit, const TensorList& outputs) {
  post_forward_order_.push_back(unit);
  const bool root = unit == 0, grad = c10::GradMode::is_enabled();
  bool needs_backward = false;
  for (const at::Tensor& t : outputs) needs_backward = needs_backward || (grad && t.defined() && t.requires_grad());
  // The root stays gathered for backward, which starts with it (FSDP2 does the same). With a
  // post-forward group a unit keeps that group's share of its parameters for backward.
  if (!needs_backward)
    groups_[unit]->reshard();
  else if (options_.reshard_after_forward && !root)
    groups_[unit]->reshard_after_forward();
  if (needs_backward)
    for (const at::Tensor& t : outputs)
      if (t.defined() && t.requires_grad()) t.register_hook([this, unit](const at::Tensor&) { pre_backward(unit); });
  if (root) last_forward_order_ = forward_order_;
}

void ShardedModel::prefetch_after(size_t unit, const std::vector<size_t>& order) {
  auto it = std::find(order.begin(), order.end(), unit);
  if (it == order.end() || it + 1 == order.end()) return;
  groups_[*(it + 1)]->unshard();
}

void ShardedModel::pre_backward(size_t unit) {
  if (!callback_queued_) {
    callback_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  }
  if (backward_started_[unit]) return;
  backward_started_[unit] = true;
  groups_[unit]->wait_for_unshard();
  if (!options_.prefetch) return;
  // The unit before this one in post-forward order runs its backward next.
  auto it = std::find(post_forward_order_.begin(), post_forward_order_.end(), unit);
  if (it == post_forward_order_.end() || it == post_forward_order_.begin()) return;
  const size_t previous = *(it - 1);
  if (!backward_done_[previous]) groups_[previous]->unshard();
}

void ShardedModel::post_backward(size_t unit) {
  if (backward_done_[unit]) return;
  backward_done_[unit] = true;
  ParamGroup& group = *groups_[unit];
  group.reshard();
  group.post_backward(sync_);
  if (!group.reduce_pending()) return;
  reduce_queue_.push_back(unit);
  // At most two reductions in flight: bounded memory, and the oldest has had time to finish.
  while (reduce_queue_.size() > 2) {
    groups_[reduce_queue_.front()]->finish_reduce();
    reduce_queue_.erase(reduce_queue_.begin());
  }
}

void ShardedModel::finish_backward() {
  // Units whose post-backward autograd did not run (inputs without gradients, the root), in the
  // same order on every rank.
  for (auto it = post_forward_order_.rbegin(); it != post_forward_order_.rend(); ++it) post_backward(*it);
  for (size_t u : reduce_queue_) groups_[u]->finish_reduce();
  reduce_queue_.clear();
  if (sync_)
    for (auto& g : groups_) g->sum_whole_gradients_over_tp();
  // The one host wait offloading needs: the gradients came down to host memory without blocking
  // (ParamGroup::finish_reduce), and the host optimizer reads them next and then writes the master
  // weights that uploads read.
  if (options_.offload_params && options_.host_transfer) {
    if (!options_.device.is_cpu())
      c10::impl::getDeviceGuardImpl(options_.device.type())->getStream(options_.device).synchronize();
    options_.host_transfer->synchronize();
  }
  for (auto& g : groups_) g->reshard();
  callback_queued_ = false;
  std::fill(backward_started_.begin(), backward_started_.end(), false);
  std::fill(backward_done_.begin(), backward_done_.end(), false);
}

void ShardedModel::zero_grad() {
  for (auto& g : groups_) g->zero_grad();
}

PersistentBytes ShardedModel::persistent_bytes() const {
  PersistentBytes b;
  for (const auto& g : groups_) {
    b.params += g->param_bytes();
    b.grads += g->grad_bytes();
  }
  return b;
}

std::vector<std::pair<std::string, at::Tensor>> ShardedModel::gather_full_state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& g : groups_)
    for (auto& kv : g->gather_full_parameters()) out.push_back(std::move(kv));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> ShardedModel::gather_full_gradients() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& g : groups_)
    for (auto& kv : g->gather_full_gradients()) out.push_back(std::move(kv));
  return out;
}

std::unique_ptr<ShardedModel> fully_shard(torch::nn::Module& model, const ModelTraits& traits, DeviceMesh mesh,
                                          FsdpOptions options) {
  if (options.device.is_cpu() && options.host_cache) install_host_cache();
  return std::make_unique<ShardedModel>(model, traits, std::move(mesh), std::move(options));
}

}  // namespace fsdp

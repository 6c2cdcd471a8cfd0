#include "fsdp/unit_call.h"

#include "fsdp/autograd_hooks.h"
#include "util/error.h"
#include "util/strings.h"

#include <unordered_map>

namespace fsdp {

namespace {

struct Entry {
  ShardedModel* model;
  size_t unit;
};

// Keyed by module address. Training runs on one thread; the registry is not locked.
std::unordered_map<const torch::nn::Module*, Entry>& registry() {
  static std::unordered_map<const torch::nn::Module*, Entry> units;
  return units;
}

}  // namespace

TensorList call(torch::nn::Module& module, const TensorList& inputs, const UnitFn& fn) {
  auto it = registry().find(&module);
  if (it == registry().end()) return fn(inputs);
  return detail::UnitHooks::run_unit(*it->second.model, it->second.unit, inputs, fn);
}

void check_unregistered(const torch::nn::Module* module) {
  FSDP_CHECK(registry().count(module) == 0, "[fsdp] fully_shard: module ", quoted(module_class_name(*module)),
             " is already a unit of another sharded model; shard a module once");
}

void register_unit(const torch::nn::Module* module, ShardedModel* model, size_t unit) {
  check_unregistered(module);
  registry().emplace(module, Entry{model, unit});
}

void unregister_units(const ShardedModel* model) {
  for (auto it = registry().begin(); it != registry().end();) {
    if (it->second.model == model)
      it = registry().erase(it);
    else
      ++it;
  }
}

}  // namespace fsdp

#include "fsdp/unit_call.h"

#include <torch/nn/module.h>

#include <unordered_map>

#include "util/error.h"
#include "util/strings.h"

namespace fsdp {

namespace {

struct Entry {
  const void* owner;
  UnitRunner run;
};

std::unordered_map<const torch::nn::Module*, Entry>& registry() {
  static std::unordered_map<const torch::nn::Module*, Entry> units;
  return units;
}

}  // namespace

std::string module_class_name(const torch::nn::Module& module) {
  std::string n = module.name();
  const size_t colon = n.rfind("::");
  if (colon != std::string::npos) n = n.substr(colon + 2);
  if (n.size() > 4 && n.compare(n.size() - 4, 4, "Impl") == 0) n.resize(n.size() - 4);
  return n;
}

TensorList call(torch::nn::Module& module, const TensorList& inputs, const UnitFn& fn) {
  auto it = registry().find(&module);
  if (it == registry().end()) return fn(inputs);
  return it->second.run(inputs, fn);
}

void check_unregistered(const torch::nn::Module* module) {
  FSDP_CHECK(registry().count(module) == 0, "[fsdp] fully_shard: module ", quoted(module_class_name(*module)),
             " is already a unit of another sharded model; shard a module once");
}

void register_unit(const torch::nn::Module* module, const void* owner, UnitRunner run) {
  check_unregistered(module);
  registry().emplace(module, Entry{owner, std::move(run)});
}

void unregister_units(const void* owner) {
  for (auto it = registry().begin(); it != registry().end();) {
    if (it->second.owner == owner)
      it = registry().erase(it);
    else
      ++it;
  }
}

}  // namespace fsdp

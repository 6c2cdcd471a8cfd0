// fsdp::call: how a model runs a submodule that may be an FSDP unit.
//
// LibTorch modules have no forward hooks, so a model that wants to be sharded runs each module of
// its ModelTraits::unit_classes through call(): when fully_shard made that module a unit, the call
// gathers its parameters, records its backward hooks and frees it afterwards; otherwise (no
// sharding, or the module is not a unit) it is just fn(inputs). Models stay usable unsharded.
//
// Threads: call() runs on the thread that runs forward (the training thread). The backward hooks it
// registers run where autograd runs backward: on CUDA, the engine's thread for that device, with
// the current device set to it and the current stream the one the forward op ran on; on CPU, the
// calling thread. Only one of them runs the engine at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace fsdp {

using TensorList = std::vector<at::Tensor>;
using UnitFn = std::function<TensorList(const TensorList&)>;

TensorList call(torch::nn::Module& module, const TensorList& inputs, const UnitFn& fn);

// One tensor in, one out: call(*layer, x, [layer](const at::Tensor& h) { return layer->forward(h); }).
template <typename F>
at::Tensor call(torch::nn::Module& module, const at::Tensor& input, F fn) {
  return call(module, TensorList{input}, [fn](const TensorList& in) mutable { return TensorList{fn(in[0])}; })[0];
}

// The class name wrap policies match: the C++ type's name without namespaces or a trailing "Impl"
// ("torch::nn::LinearImpl" -> "Linear"), unless the module was given a name.
std::string module_class_name(const torch::nn::Module& module);

// The registry call() looks units up in, keyed by module: what runs a unit's forward through its
// owner's hooks. fully_shard fills it and ~ShardedModel empties it (owner: the ShardedModel). A
// module is a unit of one live owner at most: registering it again throws InputError, and
// check_unregistered throws the same before anything is sharded. Training runs on one thread at a
// time; the registry is not locked.
using UnitRunner = std::function<TensorList(const TensorList&, const UnitFn&)>;
void check_unregistered(const torch::nn::Module* module);
void register_unit(const torch::nn::Module* module, const void* owner, UnitRunner run);
void unregister_units(const void* owner);

}  // namespace fsdp

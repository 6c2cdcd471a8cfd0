// Replacing a parameter's data in place (every module and alias holding it sees the new tensor;
// autograd keeps its identity), between any two devices.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/_has_compatible_shallow_copy_type.h>

namespace fsdp {

// Variable::set_data, also where LibTorch refuses it: between backends it does not count as the same
// kind of dense tensor, such as the CPU and the meta device (which stands in for a GPU in the tests:
// a model built on the CPU is sharded onto it). There the same shallow copy of the tensor's metadata
// is made directly; for a tensor no autograd graph has used yet, as a parameter before sharding.
inline void set_data_any_device(const at::Tensor& var, const at::Tensor& data) {
  if (at::_has_compatible_shallow_copy_type(var, data)) return var.set_data(data);
  var.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
}

}  // namespace fsdp

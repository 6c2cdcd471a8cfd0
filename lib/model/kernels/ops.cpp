#include "model/kernels/ops.h"

namespace fsdp::model::kernels {

namespace {

const Ops& table_of(Provider resolved) {
  switch (resolved) {
    case Provider::kHost:
      return host_ops();
    case Provider::kPortable:
      return portable_ops();
    case Provider::kAuto:  // resolved by provider_for
    case Provider::kReference:
      break;
  }
  return reference_ops();
}

}  // namespace

const Ops& ops_for(const at::Tensor& x) {
  return table_of(provider_for(x));
}

const Ops& planned_ops(Provider choice, c10::DeviceType device) {
  if (choice == Provider::kAuto) choice = device == c10::kCPU ? Provider::kHost : Provider::kPortable;
  return table_of(choice);
}

}  // namespace fsdp::model::kernels

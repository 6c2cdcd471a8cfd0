#include "model/kernels/ops.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

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

at::Tensor grouped_mm_by_group(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offsets) {
  const at::Tensor ends = offsets.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* end = ends.data_ptr<int64_t>();
  std::vector<at::Tensor> out;
  int64_t start = 0;
  for (int64_t e = 0; e < w.size(0); ++e) {
    if (end[e] > start) out.push_back(at::mm(x.narrow(0, start, end[e] - start), w[e]));
    start = end[e];
  }
  if (out.empty()) return x.new_zeros({x.size(0), w.size(2)});
  return out.size() == 1 ? out[0] : at::cat(out, 0);
}

bool grouped_mm_applies(const at::Tensor& x, const at::Tensor& w) {
  const at::ScalarType t = x.scalar_type();
  if ((t != at::kFloat && t != at::kBFloat16 && t != at::kHalf) || w.scalar_type() != t || x.dim() != 2 ||
      w.dim() != 3)
    return false;
  if (x.is_meta() && w.is_meta()) return true;  // shapes only: the meta kernel takes any strides
  const int64_t align = 16 / static_cast<int64_t>(x.element_size());
  auto laid_out = [&](const at::Tensor& m) {
    if (!m.is_meta() && reinterpret_cast<uintptr_t>(m.const_data_ptr()) % 16 != 0) return false;
    const int64_t rows = m.stride(-2), cols = m.stride(-1);
    return (cols == 1 && rows % align == 0) || (rows == 1 && cols % align == 0);
  };
  return laid_out(x) && laid_out(w) && x.size(1) % align == 0 && w.size(2) % align == 0;
}

const Ops& planned_ops(Provider choice, c10::DeviceType device) {
  if (choice == Provider::kAuto) choice = device == c10::kCPU ? Provider::kHost : Provider::kPortable;
  return table_of(choice);
}

}  // namespace fsdp::model::kernels

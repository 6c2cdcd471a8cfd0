#include "model/layers/norm.h"

#include <ATen/ATen.h>

#include "model/kernels/ops.h"

namespace fsdp::model {

RmsNormImpl::RmsNormImpl(int64_t dim, double e, bool offset, bool fp32)
    : torch::nn::Module("RmsNorm"), eps(e), unit_offset(offset), fp32_product(fp32) {
  weight = register_parameter("weight", offset ? at::zeros({dim}) : at::ones({dim}));
}

at::Tensor RmsNormImpl::forward(const at::Tensor& x) {
  const kernels::Ops& ops = kernels::ops_for(x);
  if (!unit_offset && !fp32_product) return ops.rms_norm(x, weight, eps);
  // In fp32 throughout, then cast: the op's cast after the statistics is then no cast.
  const at::Tensor w = unit_offset ? weight.to(at::kFloat) + 1.0 : weight.to(at::kFloat);
  return ops.rms_norm(x.to(at::kFloat), w, eps).to(x.scalar_type());
}

RmsNorm norm_of(const DecoderConfig& c, int64_t dim) {
  return RmsNorm(dim, c.rms_norm_eps, c.norm_unit_offset, c.norm_fp32_product);
}

at::Tensor unweighted_rms_norm(const at::Tensor& x, double eps) {
  const at::Tensor ones = at::ones({x.size(-1)}, x.options().dtype(at::kFloat));
  return kernels::ops_for(x).rms_norm(x.to(at::kFloat), ones, eps).to(x.scalar_type());
}

}  // namespace fsdp::model

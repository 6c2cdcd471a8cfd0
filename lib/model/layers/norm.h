// The decoder's RMSNorm, in the forms the families use (Llama's; Gemma's (1 + w) in fp32; OLMo 2's
// product in fp32). Not thread-safe (LibTorch modules).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "model/config/hf_config.h"

namespace fsdp::model {

class RmsNormImpl : public torch::nn::Module {
 public:
  // unit_offset (Gemma): normed * (1 + weight). fp32_product (Gemma, OLMo 2): the product with the
  // weight in fp32, then the cast to x's dtype (Llama: the cast, then the product).
  RmsNormImpl(int64_t dim, double eps, bool unit_offset = false, bool fp32_product = false);
  // fp32 statistics, cast back, then * weight: the rms_norm op (model/kernels/ops.h). The portable
  // provider, with x and weight of one dtype: LibTorch's fused rms_norm (one kernel each way on a GPU;
  // the product with weight before the cast, so bf16 rounds once instead of twice); the host's:
  // model/kernels/fused_ops.h; the reference: ATen's ops one by one.
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;  // (C)
  double eps;
  bool unit_offset, fp32_product;
};
TORCH_MODULE(RmsNorm);

// A norm of `dim` in the config's form (norm_unit_offset, norm_fp32_product, rms_norm_eps).
RmsNorm norm_of(const DecoderConfig& c, int64_t dim);

// RMSNorm over the last dimension without a weight, in fp32, then cast to x's dtype (Gemma 4's v_norm).
at::Tensor unweighted_rms_norm(const at::Tensor& x, double eps);

}  // namespace fsdp::model

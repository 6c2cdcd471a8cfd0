// The portable provider (model/kernels/ops.h): the kernels a GPU runs — elementwise.h's functors
// launched by ATen's loops, LibTorch's rms_norm, SDPA's grouped heads and flash attention. On the CPU
// it runs the GPU's arithmetic (what the CPU tests check); on the meta device, shapes alone.
#include <ATen/ATen.h>
#include <ATen/SDPBackend.h>
#include <torch/library.h>

#include "model/kernels/elementwise.h"
#include "model/kernels/delta_rule.h"
#include "model/kernels/ops.h"

namespace fsdp::model::kernels {

namespace {

// When attention takes LibTorch's CUDA flash kernels (the decoder's packed rows, context parallel's
// blocks): q (B, H, T, D) on a CUDA device, in bf16 or fp16, with D a multiple of 8 up to 256 (the
// kernel's head sizes). Elsewhere attention takes SDPA's other kernels or ATen's ops one by one.
bool flash_attention_applies(const at::Tensor& q) {
  const bool half = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
  return q.is_cuda() && half && q.size(-1) % 8 == 0 && q.size(-1) <= 256;
}

class PortableOps final : public Ops {
 public:
  Provider provider() const override { return Provider::kPortable; }

  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) const override {
    if (x.scalar_type() != weight.scalar_type()) return reference_ops().rms_norm(x, weight, eps);
    return at::rms_norm(x, {weight.size(0)}, weight, eps);
  }

  std::pair<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                           const at::Tensor& sin) const override {
    return {kernels::rotary(q.transpose(1, 2), cos, sin), kernels::rotary(k.transpose(1, 2), cos, sin)};
  }

  at::Tensor swiglu(const at::Tensor& gate_up) const override { return kernels::swiglu(gate_up); }
  at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) const override { return kernels::swiglu(gate, up); }
  std::optional<at::Tensor> gate_up_swiglu(const at::Tensor& x, const at::Tensor& w) const override {
    return kernels::gate_up_swiglu(x, w);
  }
  bool stacked_products() const override { return true; }

  std::optional<at::Tensor> causal_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&) const override {
    return std::nullopt;  // SDPA's
  }
  // Asked of SDPA's own choice, so the call that follows runs what was asked about: flash or cuDNN
  // read each query head's kv head in place.
  bool attention_groups_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const override {
    if (q.is_cpu() || q.is_meta()) return false;
    const auto backend = static_cast<at::SDPBackend>(
        at::_fused_sdp_choice(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt, /*enable_gqa=*/true));
    return backend == at::SDPBackend::flash_attention || backend == at::SDPBackend::cudnn_attention;
  }
  bool varlen_flash_attention(const at::Tensor& q) const override { return flash_attention_applies(q); }
  at::Tensor softcapped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                  double scale, double cap) const override {
    return apply_softcapped_attention(q, k, v, mask, scale, cap);  // no fused kernel takes the cap
  }
  at::Tensor sink_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale, const at::Tensor& sinks) const override {
    return apply_sink_attention(q, k, v, mask, scale, sinks);  // no fused kernel takes the sinks
  }
  BlockAttention block_attention(const at::Tensor& q) const override {
    if (q.is_cpu()) return BlockAttention::kCpuFlash;
    return flash_attention_applies(q) ? BlockAttention::kCudaFlash : BlockAttention::kMath;
  }
  bool blockwise_scores() const override { return true; }
  std::pair<at::Tensor, at::Tensor> delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const at::Tensor& g, const at::Tensor& beta,
                                               const at::Tensor& state) const override {
    return delta_rule_chunked(q, k, v, g, beta, state);
  }

  at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offsets) const override {
    return grouped_mm_applies(x, w) ? at::_grouped_mm(x, w, offsets) : grouped_mm_by_group(x, w, offsets);
  }

  bool loss_by_vocabulary() const override { return true; }
  void exp_shifted_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) const override {
    kernels::exp_shifted_out(out, a, b);
  }

  // The amax in one reduction (abs().amax() would write |x| first; exact in x's dtype), then the
  // scale and the cast in one launch each.
  at::Tensor to_float8_out(const at::Tensor& rows, const at::Tensor& cols, const at::Tensor& x,
                           std::optional<int64_t> reduce_dim, bool power_of_2, float max) const override {
    const at::Tensor amax = reduce_dim ? at::linalg_vector_norm(x, INFINITY, at::IntArrayRef{*reduce_dim}, true)
                                       : at::linalg_vector_norm(x, INFINITY);
    const at::TensorOptions fp32 = amax.options().dtype(at::kFloat);
    const at::Tensor scale = at::empty(amax.sizes(), fp32), inverse = at::empty(amax.sizes(), fp32);
    float8_scale_out(scale, inverse, amax, max, power_of_2);
    kernels::to_float8_out(rows, cols, x, scale, max);
    return inverse;
  }
};


// ATen's _grouped_mm has no meta kernel in C++ (its fallback reads the offsets): its shapes, so a
// mixture of experts runs on meta (shape proofs, the step's bill) as a GPU runs it. 2D x 3D (the
// forward, and the input's gradient), 2D x 2D with groups along K (the weights' gradient: one
// (K, N) block a group), 3D x 2D, 3D x 3D.
at::Tensor grouped_mm_meta(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs,
                           const std::optional<at::Tensor>&, std::optional<at::ScalarType> out_dtype) {
  std::vector<int64_t> shape;
  if (a.dim() == 2 && b.dim() == 3)
    shape = {a.size(0), b.size(2)};
  else if (a.dim() == 3 && b.dim() == 2)
    shape = {a.size(1), b.size(1)};
  else if (a.dim() == 2 && b.dim() == 2)
    shape = {offs ? offs->size(0) : 1, a.size(0), b.size(1)};
  else
    shape = {a.size(0), a.size(1), b.size(2)};
  return at::empty(shape, a.options().dtype(out_dtype.value_or(a.scalar_type())));
}

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("_grouped_mm", grouped_mm_meta);
}

}  // namespace

const Ops& portable_ops() {
  static const PortableOps ops;
  return ops;
}

}  // namespace fsdp::model::kernels

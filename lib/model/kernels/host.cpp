// The host provider (model/kernels/ops.h): the CPU's own kernels — fused_ops.h's vectorized RMSNorm,
// rotary embedding of q and k in one pass and SwiGLU; causal attention with its products on oneDNN
// (causal_attention.h) — and, where the CPU has none of its own, the portable kernels' CPU loops.
#include <ATen/ATen.h>

#include "model/kernels/causal_attention.h"
#include "model/kernels/elementwise.h"
#include "model/kernels/fused_ops.h"
#include "model/kernels/delta_rule.h"
#include "model/kernels/ops.h"

namespace fsdp::model::kernels {

namespace {

class HostOps final : public Ops {
 public:
  Provider provider() const override { return Provider::kHost; }

  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) const override {
    if (!weight.is_contiguous()) return reference_ops().rms_norm(x, weight, eps);
    return fused_rms_norm(x.contiguous(), weight, eps);
  }

  // q and k in one pass; packed rows' per-token angles ((B, 1, T, D)) take the functor's loops.
  std::pair<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                           const at::Tensor& sin) const override {
    if (cos.dim() != 2) return portable_ops().rotary(q, k, cos, sin);
    auto [rq, rk] = fused_rotary(q, k, cos, sin);
    return {rq.transpose(1, 2), rk.transpose(1, 2)};
  }

  at::Tensor swiglu(const at::Tensor& gate_up) const override { return fused_swiglu(gate_up); }
  at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) const override {
    return fused_swiglu(gate.contiguous(), up.contiguous());
  }
  std::optional<at::Tensor> gate_up_swiglu(const at::Tensor&, const at::Tensor&) const override {
    return std::nullopt;  // oneDNN's product of the stacked weights, then fused_swiglu
  }
  bool stacked_products() const override { return true; }

  std::optional<at::Tensor> causal_attention(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v) const override {
    if (!causal_attention_applies(q, k)) return std::nullopt;
    return model::causal_attention(q, k, v);
  }
  bool attention_groups_heads(const at::Tensor&, const at::Tensor&, const at::Tensor&) const override {
    return false;  // SDPA's CPU kernels take the heads repeated
  }
  bool varlen_flash_attention(const at::Tensor&) const override { return false; }
  at::Tensor softcapped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                  double scale, double cap) const override {
    return apply_softcapped_attention(q, k, v, mask, scale, cap);  // no fused kernel takes the cap
  }
  at::Tensor sink_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale, const at::Tensor& sinks) const override {
    return apply_sink_attention(q, k, v, mask, scale, sinks);  // no fused kernel takes the sinks
  }
  BlockAttention block_attention(const at::Tensor&) const override { return BlockAttention::kCpuFlash; }
  bool blockwise_scores() const override { return true; }

  std::pair<at::Tensor, at::Tensor> delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const at::Tensor& g, const at::Tensor& beta,
                                               const at::Tensor& state) const override {
    return delta_rule_chunked(q, k, v, g, beta, state);
  }

  at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offsets) const override {
    return grouped_mm_applies(x, w) ? at::_grouped_mm(x, w, offsets) : grouped_mm_by_group(x, w, offsets);
  }

  bool loss_by_vocabulary() const override { return false; }  // token chunks: oneDNN's (C, V) layout
  void exp_shifted_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) const override {
    kernels::exp_shifted_out(out, a, b);
  }

  at::Tensor to_float8_out(const at::Tensor& rows, const at::Tensor& cols, const at::Tensor& x,
                           std::optional<int64_t> reduce_dim, bool power_of_2, float max) const override {
    return portable_ops().to_float8_out(rows, cols, x, reduce_dim, power_of_2, max);
  }
};

}  // namespace

const Ops& host_ops() {
  static const HostOps ops;
  return ops;
}

}  // namespace fsdp::model::kernels

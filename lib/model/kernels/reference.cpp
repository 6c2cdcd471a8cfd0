// The reference provider (model/kernels/ops.h): ATen's ops one by one, as transformers and torchao
// write them. Every other provider is tested against these numerics.
#include <ATen/ATen.h>

#include <limits>

#include "model/kernels/delta_rule.h"
#include "model/kernels/ops.h"

namespace fsdp::model::kernels {

namespace {

// The halves as one split, not two narrows: autograd takes a split's gradient back as one cat, and
// each narrow's as a zero-filled copy of the whole input (and their sum): on a GPU, kernels for nothing.
at::Tensor rotate_half(const at::Tensor& x) {
  const std::vector<at::Tensor> halves = x.chunk(2, -1);
  return at::cat({-halves[1], halves[0]}, -1);
}

class ReferenceOps final : public Ops {
 public:
  Provider provider() const override { return Provider::kReference; }

  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) const override {
    const at::Tensor h = x.to(at::kFloat);
    const at::Tensor normed = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
    return weight * normed.to(x.scalar_type());
  }

  std::pair<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                           const at::Tensor& sin) const override {
    return {apply_rotary(q.transpose(1, 2), cos, sin), apply_rotary(k.transpose(1, 2), cos, sin)};
  }

  at::Tensor swiglu(const at::Tensor& gate_up) const override {
    const std::vector<at::Tensor> parts = gate_up.chunk(2, -1);
    return swiglu(parts[0], parts[1]);
  }
  at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) const override { return at::silu(gate) * up; }
  std::optional<at::Tensor> gate_up_swiglu(const at::Tensor&, const at::Tensor&) const override { return std::nullopt; }
  bool stacked_products() const override { return false; }  // one product per weight

  std::optional<at::Tensor> causal_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&) const override {
    return std::nullopt;
  }
  bool attention_groups_heads(const at::Tensor&, const at::Tensor&, const at::Tensor&) const override { return false; }
  bool varlen_flash_attention(const at::Tensor&) const override { return false; }
  at::Tensor softcapped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                  double scale, double cap) const override {
    return apply_softcapped_attention(q, k, v, mask, scale, cap);  // no fused kernel takes the cap
  }
  at::Tensor sink_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale, const at::Tensor& sinks) const override {
    return apply_sink_attention(q, k, v, mask, scale, sinks);  // no fused kernel takes the sinks
  }
  BlockAttention block_attention(const at::Tensor&) const override { return BlockAttention::kMath; }
  bool blockwise_scores() const override { return false; }

  std::pair<at::Tensor, at::Tensor> delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const at::Tensor& g, const at::Tensor& beta,
                                               const at::Tensor& state) const override {
    return delta_rule_recurrent(q, k, v, g, beta, state);
  }

  at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offsets) const override {
    return grouped_mm_by_group(x, w, offsets);
  }

  bool loss_by_vocabulary() const override { return false; }
  void exp_shifted_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) const override {
    at::Tensor o = out, scratch = a;  // handles: written through
    if (o.is_same(a))
      o.sub_(b).exp_();
    else
      at::exp_out(o, scratch.sub_(b));  // in a's memory, no temporary
  }

  at::Tensor to_float8_out(const at::Tensor& rows, const at::Tensor& cols, const at::Tensor& x,
                           std::optional<int64_t> reduce_dim, bool power_of_2, float max) const override {
    const at::Tensor amax = reduce_dim ? x.abs().amax({*reduce_dim}, /*keepdim=*/true) : x.abs().max();
    at::Tensor scale = (static_cast<double>(max) / amax.to(at::kDouble).clamp_min(1e-12)).to(at::kFloat);
    if (power_of_2) scale = at::exp2(at::floor(at::log2(scale)));
    const at::Tensor scaled = (x.to(at::kFloat) * scale).clamp(-max, max);
    for (const at::Tensor* bits : {&rows, &cols})
      if (bits->defined()) bits->copy_(scaled);
    return scale.reciprocal();
  }
};

}  // namespace

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + rotate_half(x) * sin;
}

namespace {

// Attention's weights as transformers' eager attention takes them: the keys `mask` refuses at -inf,
// the softmax in at least fp32 and cast back to `dtype`; with `sink` (B, H, T, 1), a column of its
// own in the softmax whose weight goes to no key.
at::Tensor eager_weights(const at::Tensor& scores, const at::Tensor& mask, const at::Tensor& sink,
                         at::ScalarType dtype) {
  const at::Tensor masked = scores.masked_fill(mask.bitwise_not(), -std::numeric_limits<double>::infinity());
  const at::ScalarType softmax_type = dtype == at::kDouble ? at::kDouble : at::kFloat;  // at least fp32
  if (!sink.defined()) return at::softmax(masked, -1, softmax_type).to(dtype);
  return at::softmax(at::cat({masked, sink}, -1), -1, softmax_type).narrow(-1, 0, scores.size(-1)).to(dtype);
}

}  // namespace

at::Tensor apply_softcapped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& mask, double scale, double cap) {
  const at::Tensor scores = at::tanh(at::matmul(q, k.transpose(-2, -1)) * scale / cap) * cap;
  return at::matmul(eager_weights(scores, mask, {}, q.scalar_type()), v);
}

at::Tensor apply_sink_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                double scale, const at::Tensor& sinks) {
  const at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;  // (B, H, T, S)
  const at::Tensor sink = sinks.to(q.scalar_type()).view({1, -1, 1, 1}).expand({q.size(0), -1, q.size(2), 1});
  return at::matmul(eager_weights(scores, mask, sink, q.scalar_type()), v);
}

const Ops& reference_ops() {
  static const ReferenceOps ops;
  return ops;
}

}  // namespace fsdp::model::kernels

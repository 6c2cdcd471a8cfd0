// The model's named ops behind one seam. The decoder's modules, its loss and context parallel call
// these ops and never ask which provider or device runs them; each provider (model/kernels/provider.h)
// implements every op in its own file, mirrored as MLX mirrors eval_cpu and eval_gpu:
//   - host.cpp: the CPU's own kernels (model/kernels/fused_ops.h, oneDNN's causal attention);
//   - portable.cpp: the GPU's kernels (model/kernels/elementwise.h, LibTorch's rms_norm, flash
//     attention), which on the CPU run the GPU's arithmetic so that CPU tests check them;
//   - reference.cpp: ATen's ops one by one, the numerics the others are tested against
//     (tests/model/ops_test.cpp holds every op of every provider to it).
// ops_for(x) is the one place an op's provider is chosen: engine.kernels resolved for x's device
// (the products in model/kernels/linear.h read the same choice for oneDNN's).
// A new kernel is a new op here and one implementation in each of the three files.
//
// Thread safety: the tables are immutable; ops_for reads the process's choice (set before the model
// runs). Collective: no op here communicates.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <utility>

#include "model/kernels/provider.h"

namespace fsdp::model::kernels {

// How context parallel computes one block of attention (a query chunk against a key chunk): SDPA's
// flash kernel on the CPU, LibTorch's CUDA flash kernel, or ATen's ops one by one.
enum class BlockAttention { kCpuFlash, kCudaFlash, kMath };

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Provider provider() const = 0;

  // --- normalization and positions ---------------------------------------------------------------
  // RMSNorm of x (..., C): statistics in fp32, cast back to x's dtype, times weight (C).
  virtual at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) const = 0;
  // The rotary embedding of q (B, T, H, D) and k (B, T, K, D) with cos and sin in HF's layout, (T, D)
  // or (B, 1, T, D) for packed rows' positions; returns them as (B, H, T, D) and (B, K, T, D).
  virtual std::pair<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                   const at::Tensor& sin) const = 0;

  // --- the MLP -------------------------------------------------------------------------------------
  // silu(gate) * up from gate_up (..., 2F), gate its first F columns.
  virtual at::Tensor swiglu(const at::Tensor& gate_up) const = 0;
  // silu(gate) * up from gate and up of one shape.
  virtual at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) const = 0;
  // silu(x gate^T) * (x up^T) for x (..., C) and the stacked weights w (2F, C), without bias, as one
  // op (elementwise.h's gate_up_swiglu), where the provider has one; else nullopt (a product, then
  // swiglu).
  virtual std::optional<at::Tensor> gate_up_swiglu(const at::Tensor& x, const at::Tensor& w) const = 0;
  // Whether weights laid end to end (model/kernels/stacked_weights.h) are multiplied as one product; the
  // reference takes one product per weight.
  virtual bool stacked_products() const = 0;

  // --- attention ------------------------------------------------------------------------------------
  // softmax(q k^T / sqrt(D)) v, causal, queries and keys of one span, q (B, H, T, D) and k, v
  // (B, K, T, D), returned as (B, H, T, D), by the provider's own kernel where it has one for these
  // tensors; else nullopt (SDPA).
  virtual std::optional<at::Tensor> causal_attention(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v) const = 0;
  // Whether SDPA's causal kernel for these tensors reads grouped kv heads in place (else k and v are
  // repeated per query head first).
  virtual bool attention_groups_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const = 0;
  // Whether packed rows take variable-length flash attention (portable.cpp: flash_attention_applies), else
  // SDPA with a mask.
  virtual bool varlen_flash_attention(const at::Tensor& q) const = 0;
  // softmax(cap * tanh(q k^T * scale / cap)) v over the keys `mask` allows (bool, broadcast to
  // (B, H, T, S)): q (B, H, T, D), k and v (B, H, S, D) (kv heads repeated) -> (B, H, T, D). Gemma 2's
  // soft-capped scores, which no fused attention kernel takes (SDPA's flash, memory-efficient or
  // cuDNN kernels): every provider computes the scores whole, as transformers' eager attention does
  // (apply_softcapped_attention).
  virtual at::Tensor softcapped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& mask, double scale, double cap) const = 0;
  // softmax over [q k^T * scale, sink] of the keys `mask` allows (bool, broadcast to (B, H, T, S)) and
  // one more logit per head, sinks (H), whose weight goes to no value, times v: q (B, H, T, D), k and
  // v (B, H, S, D) (kv heads repeated) -> (B, H, T, D). gpt-oss's attention sinks, which no fused
  // attention kernel here takes: every provider computes the scores whole, as transformers' eager
  // attention does (apply_sink_attention).
  virtual at::Tensor sink_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& mask, double scale, const at::Tensor& sinks) const = 0;
  // Context parallel's kernel for a block of q (B, H, L, D).
  virtual BlockAttention block_attention(const at::Tensor& q) const = 0;
  // Whether a whole sequence's capped or sunk scores (from position 0, packed records or not) take
  // context parallel's blocks on one device (model/parallel/context_parallel.h: blockwise_attention:
  // flash blocks, nothing (T, T) kept), else softcapped_attention and sink_attention (the reference:
  // transformers' eager sums).
  virtual bool blockwise_scores() const = 0;

  // --- linear attention ---------------------------------------------------------------------------
  // The gated delta rule (model/kernels/delta_rule.h): o (B, H, T, Dv) and the final state from q, k
  // (B, H, T, Dk), v, g, beta (B, H, T) and the entering state (undefined: zeros), all fp32. The
  // reference steps token by token; the others take the chunked form.
  virtual std::pair<at::Tensor, at::Tensor> delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& g, const at::Tensor& beta,
                                                       const at::Tensor& state) const = 0;

  // --- mixtures of experts ------------------------------------------------------------------------
  // x (N, K), its rows grouped by expert, times each expert's w (E, K, M) (any strides; a transposed
  // view of (E, M, K) weights is read in place): rows offsets[e - 1] .. offsets[e] - 1 by w[e], with
  // offsets (E) int32 the groups' cumulative ends on x's device -> (N, M). Host and portable: one
  // grouped product (at::_grouped_mm: CUTLASS's grouped GEMM in bf16 on sm90 and later, else one
  // product a group inside ATen), the offsets never read on the host; the reference: one product an
  // expert, its rows found from the offsets read on the host.
  virtual at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offsets) const = 0;

  // --- the loss head ----------------------------------------------------------------------------------
  // Whether the chunked loss's auto chunking takes vocabulary chunks (model/layers/chunked_loss.h), else
  // token chunks.
  virtual bool loss_by_vocabulary() const = 0;
  // out = exp(a - b) for fp32 a and b broadcast to it, out fp32, bf16 or fp16 (in place when out is
  // a): the loss's softmax numerators. a is the caller's scratch: it may be overwritten.
  virtual void exp_shifted_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) const = 0;

  // --- float8 (model/kernels/float8.h) --------------------------------------------------------------------------
  // x (M, K) scaled by max / amax (x's whole amax, or along reduce_dim; a power of 2 when asked),
  // saturated to +-max and written into rows (M, K) and/or cols (K, M) column-major (either may be
  // undefined). Returns the fp32 inverse scale (amax's shape, dimensions kept).
  virtual at::Tensor to_float8_out(const at::Tensor& rows, const at::Tensor& cols, const at::Tensor& x,
                                   std::optional<int64_t> reduce_dim, bool power_of_2, float max) const = 0;
};

// The provider's table for x's device: engine.kernels resolved by provider_for(x), whose errors it
// throws.
const Ops& ops_for(const at::Tensor& x);
// The three providers' tables, one file each (host.cpp, portable.cpp, reference.cpp): ops_for picks
// among them; the tests' op-by-provider matrix (tests/model/ops_test.cpp) runs each directly.
const Ops& host_ops();
const Ops& portable_ops();
const Ops& reference_ops();

// Ops::grouped_mm as one product a group, the groups' ends read on the host (the reference's, and
// the others' where at::_grouped_mm does not take the operands).
at::Tensor grouped_mm_by_group(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offsets);
// Whether at::_grouped_mm takes x (N, K) and w (E, K, M): fp32, bf16 or fp16, each operand's rows or
// columns contiguous with the other stride, K and M a multiple of 16 bytes, its data 16-byte aligned
// (on meta any strides: shapes only, and the groups' ends cannot be read there).
bool grouped_mm_applies(const at::Tensor& x, const at::Tensor& w);

// The reference rotation of one tensor, x * cos + rotate_half(x) * sin with rotate_half(x) =
// [-x[D/2:], x[:D/2]], for x (..., D) and cos, sin broadcastable to it (HF's apply_rotary_pos_emb).
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Soft-capped attention as transformers' eager attention computes it: the scores in q's dtype, the
// softmax in fp32 (float64 for float64 q) and cast back, then the product with v (the providers'
// softcapped_attention).
at::Tensor apply_softcapped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& mask, double scale, double cap);

// Attention with sinks as transformers' eager attention computes it: the scores in q's dtype, the
// softmax with the sink column in fp32 (float64 for float64 q) and cast back, the sink dropped, then
// the product with v (the providers' sink_attention).
at::Tensor apply_sink_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                double scale, const at::Tensor& sinks);

// The table a run on `device` would take for a choice, in a build with that device's kernels: what
// memory estimates ask before any tensor exists. Never throws.
const Ops& planned_ops(Provider choice, c10::DeviceType device);

}  // namespace fsdp::model::kernels

// Gated DeltaNet, the linear attention of Qwen3.5/3.6 (Qwen3_5GatedDeltaNet) and Qwen3-Next
// (Qwen3NextGatedDeltaNet), as transformers computes it, with its parameter names:
//   q, k, v, z, b, a from x: Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, or Qwen3-Next's
//     in_proj_qkvz and in_proj_ba, which hold each key head's q, k, v, z (and b, a) side by side;
//   q, k, v through a depthwise causal convolution (conv1d, linear_conv_kernel_dim taps) and SiLU;
//   q and k L2-normalised, q times Dk^-1/2, each key head serving Hv / Hk value heads;
//   beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) (fp32);
//   the gated delta rule (model/kernels/delta_rule.h, through the kernel seam: ops.h's delta_rule);
//   the output's RMSNorm over each value head (norm.weight, in fp32), times SiLU(z); out_proj.
// Packed records (data.packing: masked) each start from a zero state and an empty convolution
// window: the rows are taken apart into their records, computed, and put back, so a record's
// output is what it would be alone.
// Under tensor parallel (P ranks) each rank computes Hk / P key heads and their Hv / P value heads
// over the whole sequence (gathered along it): its rows of the input projections and of the
// convolution, its dt_bias and A_log, its columns of out_proj, whose partial sums are summed and
// split along the sequence again, as attention's o_proj. The parameters stay whole on every rank
// (their gradients, each rank's heads' rows, are summed over the group), so adapters and float8 do
// not apply to its projections there. Under Ulysses (P sp ranks) each rank projects its own block of
// the sequence with the whole projections, then one all-to-all for each key head's q and k and one
// for each value head's v, b and a give it every token of 1/P of the heads (of its tensor-parallel
// share), which it convolves and runs the rule on; its output goes back by a third all-to-all before
// the norm and out_proj. The convolution's, dt_bias's and A_log's rows of those heads are its own.
// Context parallel's all-gather and ring strategies are refused by the decoder layer.
//
// Shapes: B batch, T tokens, C hidden_size, Hk/Hv key/value heads, Dk/Dv their widths.
// Not thread-safe (LibTorch modules).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>

#include "model/config/hf_config.h"
#include "model/layers/attention.h"

namespace fsdp::model {

struct TensorParallel;   // model/parallel/tensor_parallel.h
struct ContextParallel;  // model/parallel/context_parallel.h

// A module that holds one parameter, "weight": the convolution's (conv_dim, 1, kernel) and the
// gated norm's (Dv), named as transformers' Conv1d and RMSNormGated hold theirs.
class WeightHolderImpl : public torch::nn::Module {
 public:
  WeightHolderImpl(const std::string& name, at::Tensor value);
  at::Tensor weight;
};
TORCH_MODULE(WeightHolder);

class GatedDeltaNetImpl : public torch::nn::Module {
 public:
  // `sp`: a Ulysses group (ContextParallel::ulysses), or none.
  explicit GatedDeltaNetImpl(const DecoderConfig& c, std::shared_ptr<TensorParallel> tp = nullptr,
                             std::shared_ptr<ContextParallel> sp = nullptr);
  // x (B, T, C) -> (B, T, C); with `packed` (on x's device), each record as if alone.
  at::Tensor forward(const at::Tensor& x, const Packed& packed = {});
  // T new tokens after the cache's: their output, the cache's window and state carried on.
  at::Tensor forward_cached(const at::Tensor& x, LayerCache& cache);

  at::Tensor dt_bias, A_log;  // (Hv)
  torch::nn::Linear in_proj_qkv{nullptr}, in_proj_z{nullptr}, in_proj_b{nullptr}, in_proj_a{nullptr};
  torch::nn::Linear in_proj_qkvz{nullptr}, in_proj_ba{nullptr};  // Qwen3-Next's
  WeightHolder conv1d{nullptr}, norm{nullptr};
  torch::nn::Linear out_proj{nullptr};
  LinearAttentionConfig shape;
  double eps;
  std::shared_ptr<TensorParallel> tp;
  std::shared_ptr<ContextParallel> sp;
  int64_t key_heads, value_heads;  // the heads this rank projects (all of them without tensor parallel)
  // The heads this rank convolves and mixes: its projected ones, or an sp rank's 1/P of them; they
  // are block `mixed_block` of the model's heads in blocks of this size.
  int64_t mixed_key_heads, mixed_value_heads, mixed_block;

 private:
  struct Projected {
    at::Tensor qkv;   // (B, T, 2 Hk Dk + Hv Dv): q, k, v end to end, before the convolution
    at::Tensor z;     // (B, T, Hv, Dv)
    at::Tensor b, a;  // (B, T, Hv)
  };
  Projected project(const at::Tensor& x);
  // Ulysses: this rank's tokens of every projected head -> every token of its mixed heads (qkv, b
  // and a; z stays with the tokens).
  Projected to_mixed_heads(const Projected& p) const;
  // The convolution (with `window`, its last inputs before x's, else zeros) and SiLU:
  // qkv (B, T, conv_dim) -> (B, T, conv_dim). next_window (decoding): set to the last conv_kernel - 1
  // inputs, the window of the tokens after these.
  at::Tensor convolve(const at::Tensor& qkv, const at::Tensor& window = {}, at::Tensor* next_window = nullptr);
  // The rule's output (B, T, Hv, Dv) in x's dtype from the convolved q, k, v and b, a; `state`:
  // the entering state (undefined: zeros), set to the leaving one when given.
  at::Tensor mix(const at::Tensor& qkv, const at::Tensor& b, const at::Tensor& a, at::Tensor* state,
                 bool step_by_step);
  // The gated norm of o (B, T, Hv, Dv) by z, then out_proj.
  at::Tensor finish(const at::Tensor& o, const at::Tensor& z);
  // Packed rows: each record laid into a row of its own (zeros after a shorter one's end, which
  // nothing before them sees), convolved and mixed, and put back: (B, T, Hv, Dv) from m's tokens.
  at::Tensor mix_records(const Projected& m, const Packed& packed);
  // `w`'s rows (dim 0) of block `block` of each part: for each (start, count), rows
  // [start + block * count, start + (block + 1) * count), end to end; w itself when nothing splits.
  at::Tensor local_rows(const at::Tensor& w, std::initializer_list<std::pair<int64_t, int64_t>> parts,
                        int64_t block) const;
  // l(x) over this rank's rows of l's weight.
  at::Tensor local_linear(const torch::nn::Linear& l, const at::Tensor& x,
                          std::initializer_list<std::pair<int64_t, int64_t>> parts) const;
};
TORCH_MODULE(GatedDeltaNet);

}  // namespace fsdp::model

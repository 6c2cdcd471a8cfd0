#include "model/parallel/tensor_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>

#include "model/config/hf_config.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x with dim's length multiplied by P.
std::vector<int64_t> grown(at::IntArrayRef shape, int64_t dim, int parts) {
  std::vector<int64_t> out = shape.vec();
  out[static_cast<size_t>(dim)] *= parts;
  return out;
}

dist::ProcessGroup group_of(const TensorParallel& tp) {
  FSDP_ASSERT(tp.group.has_value(), "a tensor-parallel collective on a model built for its shapes alone");
  return *tp.group;  // a handle; copies share the group
}

at::Tensor gather(const at::Tensor& x, int64_t dim, const TensorParallel& tp) {
  dist::ProcessGroup group = group_of(tp);
  const at::Tensor in = x.contiguous().reshape({-1});
  const at::Tensor out = at::empty({tp.size() * in.numel()}, in.options());
  group.all_gather(out, in, "tensor-parallel gather").wait();
  std::vector<int64_t> stacked = x.sizes().vec();
  stacked.insert(stacked.begin(), tp.size());
  return out.view(stacked).movedim(0, dim).reshape(grown(x.sizes(), dim, tp.size()));
}

at::Tensor reduce_scatter(const at::Tensor& x, int64_t dim, const TensorParallel& tp) {
  const int p = tp.size();
  FSDP_CHECK(x.size(dim) % p == 0, "[tp] a tensor of ", x.size(dim), " along dimension ", dim, " cannot be split over ",
             p, " tensor-parallel ranks; train.sequence_length must divide by tp_size");
  std::vector<int64_t> split = x.sizes().vec(), block = x.sizes().vec();
  block[static_cast<size_t>(dim)] /= p;
  split[static_cast<size_t>(dim)] /= p;
  split.insert(split.begin() + dim, p);
  // (..., P, n, ...) -> (P, ..., n, ...): each rank's block contiguous, rank-major.
  const at::Tensor in = x.reshape(split).movedim(dim, 0).contiguous().reshape({-1});
  const at::Tensor out = at::empty({in.numel() / p}, in.options());
  dist::ProcessGroup group = group_of(tp);
  group.reduce_scatter(out, in, dist::ReduceOp::kSum, "tensor-parallel reduce-scatter").wait();
  return out.view(block);
}

const TensorParallel& saved_group(AutogradContext* ctx) {
  return *reinterpret_cast<const TensorParallel*>(static_cast<intptr_t>(ctx->saved_data["tp"].toInt()));
}

void remember(AutogradContext* ctx, const TensorParallel& tp, int64_t dim) {
  ctx->saved_data["tp"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&tp));
  ctx->saved_data["dim"] = dim;
}

struct GatherAlong : torch::autograd::Function<GatherAlong> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, const TensorParallel* tp) {
    remember(ctx, *tp, dim);
    return gather(x, dim, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {reduce_scatter(grads[0], ctx->saved_data["dim"].toInt(), saved_group(ctx)), at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterAlong : torch::autograd::Function<ReduceScatterAlong> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, const TensorParallel* tp) {
    remember(ctx, *tp, dim);
    return reduce_scatter(x, dim, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {gather(grads[0], ctx->saved_data["dim"].toInt(), saved_group(ctx)), at::Tensor(), at::Tensor()};
  }
};

int64_t wrapped(int64_t dim, int64_t rank) {
  return dim < 0 ? dim + rank : dim;
}

}  // namespace

int tensor_parallel_dim(const std::string& name) {
  auto is = [&](const char* suffix) { return ends_with(name, suffix); };
  // A mixture of experts' router, experts and shared expert are whole on every rank, which routes its
  // own sequence block.
  if (name.find(".mlp.shared_expert") != std::string::npos) return -1;  // GLM-4.5's shared_experts too
  for (const char* column :
       {"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias", "k_proj.bias", "v_proj.bias",
        "q_b_proj.weight", "kv_b_proj.weight", "gate_proj.weight", "up_proj.weight", "gate_proj.bias", "up_proj.bias",
        "self_attn.sinks", "embed_tokens.weight", "lm_head.weight"})
    if (is(column)) return 0;
  if (is("o_proj.weight") || is("down_proj.weight")) return 1;
  // LoRA's factors: a column-parallel projection's lora_B rows go with its rows (its lora_A whole), a
  // row-parallel one's lora_A columns with its columns (its lora_B whole).
  for (const char* column :
       {"q_proj.lora_B.weight", "k_proj.lora_B.weight", "v_proj.lora_B.weight", "q_b_proj.lora_B.weight",
        "kv_b_proj.lora_B.weight", "gate_proj.lora_B.weight", "up_proj.lora_B.weight"})
    if (is(column)) return 0;
  if (is("o_proj.lora_A.weight") || is("down_proj.lora_A.weight")) return 1;
  return -1;
}

fsdp::TpSlice tensor_parallel_slice(const DecoderConfig& config, const std::string& name) {
  fsdp::TpSlice s;
  s.dim = tensor_parallel_dim(name);
  // OLMo 2's q/k norms span every head: their weights split with the heads (a per-head norm's is whole).
  if (config.qk_norm_whole &&
      (ends_with(name, "self_attn.q_norm.weight") || ends_with(name, "self_attn.k_norm.weight")))
    s.dim = 0;
  if (ends_with(name, "embed_tokens.weight") || ends_with(name, "lm_head.weight")) s.whole = config.vocab_size;
  return s;
}

bool vocab_splits(int64_t vocab, int parts) {
  return (vocab + parts - 1) / parts * (parts - 1) < vocab;
}

int64_t vocab_block(int64_t vocab, int parts) {
  const int64_t block = (vocab + parts - 1) / parts;
  FSDP_CHECK(vocab_splits(vocab, parts), "[tp] vocab_size ", vocab, " over ", parts,
             " tensor-parallel ranks would leave the last rank no token of its own (", block,
             " a rank); choose a smaller tp_size");
  return block;
}

at::Tensor gather_along(const at::Tensor& x, int64_t dim, const TensorParallel& tp) {
  return GatherAlong::apply(x, wrapped(dim, x.dim()), &tp);
}

at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, const TensorParallel& tp) {
  return ReduceScatterAlong::apply(x, wrapped(dim, x.dim()), &tp);
}

at::Tensor vocab_parallel_embedding(const at::Tensor& weight, const at::Tensor& tokens, const TensorParallel& tp,
                                    int64_t padding_idx) {
  const int64_t n = weight.size(0), first = tp.rank() * n;
  const at::Tensor mine = (tokens >= first) & (tokens < first + n);
  const int64_t local_padding = padding_idx >= first && padding_idx < first + n ? padding_idx - first : -1;
  const at::Tensor rows = at::embedding(weight, (tokens - first).clamp(0, n - 1), local_padding);
  return rows * mine.unsqueeze(-1).to(rows.scalar_type());
}

}  // namespace fsdp::model

// Tensor parallel for the decoder: Megatron-LM's layout with sequence parallel, as TorchTitan runs
// Llama (and PyTorch's ColwiseParallel / RowwiseParallel / SequenceParallel / loss_parallel give).
//
// Between layers the residual stream is split over the tp group along the sequence: (B, T/P, C) on
// each of the P ranks, so the norms run on 1/P of the tokens. Each attention and MLP block gathers
// its normed input along the sequence (gather_along), multiplies by its column-parallel weights
// (q/k/v: this rank's heads; gate/up: its F/P rows), and its row-parallel output projection (o,
// down: the matching F/P columns) gives a partial sum that reduce_scatter_along sums over the group
// and splits along the sequence again. The embedding and the head are split along the vocabulary:
// a rank embeds only its V/P tokens (the others' rows are zero, summed in the same reduce-scatter),
// and the loss (model/layers/chunked_loss.h with a TensorParallel) takes the log-sum-exp over the ranks'
// logits, so no rank holds more than V/P logits of a token. Every rank of the group reads the same
// batch and computes the same loss.
//
// Parameters every rank holds whole (the norms, Qwen3's q/k norms, row-parallel biases) get a
// partial gradient on each rank (its tokens, its heads); fully_shard sums them over the group
// (fsdp::FsdpOptions::tensor_parallel says which ones are split and which are whole).
//
// Collective over the tp group: every function here, forward and backward, in the same order on
// every rank of it (every rank runs the same layers).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>

#include "dist/process_group.h"
#include "fsdp/shard_layout.h"

namespace fsdp::model {

struct TensorParallel {
  explicit TensorParallel(dist::ProcessGroup g) : group(std::move(g)), rank_(group->rank()), size_(group->size()) {}
  // Shapes alone (estimate-memory builds rank 0's blocks of a model it never runs): no group, and
  // every collective here refuses.
  static TensorParallel shapes_only(int size) { return TensorParallel(size); }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::optional<dist::ProcessGroup> group;  // P ranks

 private:
  explicit TensorParallel(int size) : size_(size) {}
  int rank_ = 0, size_ = 1;
};

// The dimension along which tensor parallel splits a parameter of the decoder, by its Hugging Face
// name: 0 for the column-parallel q/k/v, q_b/kv_b (latent attention's) and gate/up weights and biases, gpt-oss's
// sinks (a logit per head), the embedding and lm_head (vocabulary rows), and their adapters' lora_B; 1 for the
// row-parallel o_proj and down_proj weights and their adapters' lora_A; -1 for what every rank holds whole
// (norms, o_proj/down_proj biases, latent attention's q_a_proj and kv_a_proj_with_mqa, other LoRA factors).
int tensor_parallel_dim(const std::string& name);

struct DecoderConfig;
// As the engine takes it (fsdp::FsdpOptions::tensor_parallel): the dim (0 too for OLMo 2's q/k norms over every head),
// and for the vocabulary's rows (embedding, lm_head) the whole vocab_size, which the blocks pad to a multiple of P.
fsdp::TpSlice tensor_parallel_slice(const DecoderConfig& config, const std::string& name);

// A rank's rows of a vocabulary of `vocab` over P ranks: ceil(vocab / P), the last ranks' padded
// past vocab (zero rows no token reads and no logit comes from). Throws when a rank would hold
// padding alone (vocab_splits is false).
int64_t vocab_block(int64_t vocab, int parts);
// Whether every one of P ranks holds at least one of the vocabulary's rows in those blocks.
bool vocab_splits(int64_t vocab, int parts);

// Every rank's x concatenated along `dim` (P times as long there); its gradient is the sum over the
// ranks of the incoming gradient, cut to this rank's block.
at::Tensor gather_along(const at::Tensor& x, int64_t dim, const TensorParallel& tp);
// The sum over the ranks of x, cut along `dim` into P blocks, this rank's block (x.size(dim) must
// divide by P); its gradient is gathered along `dim`.
at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, const TensorParallel& tp);

// weight (V/P, C): this rank's rows of the embedding, vocabulary rows [rank * V/P, (rank+1) * V/P)
// (V/P = vocab_block, padding past V included).
// tokens (B, T) -> (B, T, C): the rows of this rank's tokens, zeros for the others' (a partial
// sum over the ranks).
// padding_idx (>= 0, a token id of the whole vocabulary): the row whose lookups give no gradient.
at::Tensor vocab_parallel_embedding(const at::Tensor& weight, const at::Tensor& tokens, const TensorParallel& tp,
                                   int64_t padding_idx = -1);

}  // namespace fsdp::model

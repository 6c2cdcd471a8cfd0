// Long sequences split over ranks: context parallel (Accelerate's parallelism_config_cp_size, as
// PyTorch's context_parallel and TorchTitan run it) and Ulysses sequence parallel
// (parallelism_config_sp_size, DeepSpeed's ALST). The P ranks of a group read the same batch and
// each holds 1/P of every sequence's tokens through the whole model: the embedding, the norms, the
// MLP, the loss (each token counted once, by the rank that holds it). Only attention needs the
// other ranks' tokens:
//
//   context parallel: each sequence is cut into 2P chunks; rank i holds chunks i and 2P-1-i (the
//     causal load balance: every rank's queries see the same number of keys), its positions (and
//     so its rotary angles) theirs. Its queries attend to every key at or before them through
//     - allgather: K and V (at their grouped size, K heads) all-gathered before attention, their
//       gradients reduce-scattered after; or
//     - alltoall (the ring): K/V blocks passed to the next rank P-1 times while each rank merges
//       its partial attention with the log-sum-exp rule, so no rank holds the sequence's K/V; in
//       backward they go round again with their gradients, which reach their owner after P steps.
//     Each block (a query chunk against a key chunk before it, or its own chunk, causally) is one
//     flash-attention call that returns its log-sum-exp: SDPA's CPU flash kernel, CUDA's flash
//     kernel in bf16/fp16; elsewhere (fp32 on a GPU, the meta device) the same sums op by op. The
//     layer's own scores ride along: its scale, a soft cap (Gemma 2: the sums op by op, as every
//     kernel computes capped scores), a sliding window (blocks wholly outside it skipped, those it
//     cuts computed op by op over tiles of queries, each against the keys its rows see) and
//     attention sinks (gpt-oss: one more logit per head, folded into the merged log-sum-exp).
//     A window that leaves some rank's chunks unseen by another's queries changes what moves: each
//     rank sends just the keys and values other ranks' queries see, of each chunk its tail from the
//     first key a query reaches (an unequal all-to-all: under a window of w no longer than a chunk,
//     w - 1 keys to each neighbour) and backward sends their gradients home the same way; allgather
//     keeps the tails it received for backward, the ring exchanges them again (and takes this path
//     only while a rank receives from at most two chunks, what one ring step holds).
//   Ulysses: rank i holds the i-th contiguous block of T/P tokens; before attention an all-to-all
//     turns q, k, v from (its tokens, all heads) into (every token, its H/P heads), attention runs
//     whole (causal, windows, packed records as without it), and an all-to-all turns it back.
//
// Collective over the group: every function here, forward and backward, in the same order on every
// rank of it (every rank runs the same layers).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "dist/process_group.h"

namespace fsdp::model {

enum class SequenceSplit { kAllGather, kRing, kUlysses };
// "allgather", "alltoall" (Accelerate's names for the gather and the ring), "ulysses"; and back
// (config::FsdpLayout::cp_kind; anything else is allgather, Accelerate's default).
const char* sequence_split_name(SequenceSplit how);
SequenceSplit sequence_split_named(const std::string& name);

struct ContextParallel {
  ContextParallel(dist::ProcessGroup g, SequenceSplit h)
      : group(std::move(g)), how(h), rank_(group->rank()), size_(group->size()) {}
  // Shapes alone (estimate-memory): no group; every collective here refuses.
  static ContextParallel shapes_only(int size, SequenceSplit h) { return ContextParallel(size, h); }
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool ulysses() const { return how == SequenceSplit::kUlysses; }
  std::optional<dist::ProcessGroup> group;  // P ranks
  SequenceSplit how;

 private:
  ContextParallel(int size, SequenceSplit h) : how(h), size_(size) {}
  int rank_ = 0, size_ = 1;
};

// The tokens of a sequence a rank holds: their positions 0..T-1 (int64, on `device`), in the order
// the rank holds them. How many tokens a sequence must divide into: 2P (context parallel) or P.
at::Tensor sequence_positions(int64_t seq_len, const ContextParallel& cp, const c10::Device& device);
int64_t sequence_multiple(const ContextParallel& cp);

// How a layer scores its keys beyond softmax(q k^T / sqrt(D)) over every key at or before the query
// (model/layers/attention.h's settings).
struct ScoreRule {
  std::optional<double> scale;  // of q k^T; unset: 1 / sqrt(D)
  double softcap = 0;           // > 0: a score s becomes softcap * tanh(s / softcap)
  int64_t window = 0;           // > 0: a query sees the keys fewer than `window` positions before it
};

// Context parallel's causal attention: q (B, H, L, D), k and v (B, K, L, D), this rank's L = T/P
// tokens as sequence_positions lays them out (rotated already); H a multiple of K; scored by `rule`;
// sinks (H), one more logit per query head in each query's softmax whose weight goes to no
// value (undefined: none). Returns (B, H, L, D) in q's dtype. Differentiable in q, k, v and sinks.
at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextParallel& cp,
                             const ScoreRule& rule = {}, const at::Tensor& sinks = {});

// The same blocks on one device, the whole sequence (T tokens from position 0, queries and keys alike)
// one chunk against itself: flash attention where the rule leaves the scores plain and no window cuts
// them, tiles op by op where one does, the scores are capped or records are packed (segments (B, T)
// int64, each token's record in its row: a query sees its own record's keys only), sinks folded into
// the log-sum-exp. No (T, T) scores are kept for backward, and a window's tiles hold O(T x window) of
// them at a time: what attention runs for gpt-oss's sinks and Gemma 2's caps, which no fused kernel
// takes. Shapes, dtypes and gradients as context_attention's.
// `first_keys` (T entries, with segments; empty: unbounded): the first key position i's record lets a
// query of any row see (Packed::first_key), so that each tile reads only from its first row's record on.
at::Tensor blockwise_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ScoreRule& rule,
                               const at::Tensor& sinks = {}, const at::Tensor& segments = {},
                               const std::vector<int64_t>& first_keys = {});

// Ulysses' all-to-all: x (B, L, N, D), this rank's L = T/P tokens of N heads -> (B, T, N/P, D), every
// token of this rank's N/P heads; and back. N must divide by P. Their gradients are each other.
at::Tensor ulysses_to_heads(const at::Tensor& x, const ContextParallel& cp);
at::Tensor ulysses_to_tokens(const at::Tensor& x, const ContextParallel& cp);

// Whether a layer of sliding window `window` (0: none) over sequences of T tokens exchanges only the
// keys its windows see (above) rather than running the strategy's collectives: the same answer on
// every rank of the group. Never under Ulysses.
bool exchanges_window(const ContextParallel& cp, int64_t seq_len, int64_t window);
// The other ranks' K/V chunks rank cp.rank() receives (some of) for such a layer (for a group of its
// shapes alone, the busiest rank's): all 2(P-1) of them unless the window exchanges.
int64_t chunks_received(const ContextParallel& cp, int64_t seq_len, int64_t window);
// The other ranks' keys (with their values) rank cp.rank() receives for such a layer (for a group of its
// shapes alone, the busiest rank's): all 2(P-1) chunks' unless the window exchanges. What allgather keeps
// for backward.
int64_t keys_received(const ContextParallel& cp, int64_t seq_len, int64_t window);

// The bytes rank cp.rank()'s sequence-split collectives send for one layer's attention, forward and
// backward (dist::bytes_sent's rule), for B sequences of T tokens, H query and K kv heads of D over
// this group (heads as this rank's tensor-parallel share), activations of `elem` bytes, the layer's
// sliding window `window` (0: none). What the accounting test asserts and estimate-memory reports
// (for a group of its shapes alone, the busiest rank's).
int64_t sequence_split_bytes(const ContextParallel& cp, int64_t batch, int64_t seq_len, int64_t heads, int64_t kv_heads,
                             int64_t head_dim, int64_t elem, int64_t window = 0);
// The same for one Gated DeltaNet layer under Ulysses (cp.ulysses()): each of Hk key heads' q and k
// (2 Dk) and each of Hv value heads' v, b and a (Dv + 2) to heads, the output (Dv) back, forward and
// backward (heads as this rank's tensor-parallel share).
int64_t ulysses_linear_attention_bytes(const ContextParallel& cp, int64_t batch, int64_t seq_len, int64_t key_heads,
                                       int64_t value_heads, int64_t key_head_dim, int64_t value_head_dim, int64_t elem);

}  // namespace fsdp::model

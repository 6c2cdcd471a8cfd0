// The language-model loss without the full logits: sum over tokens of cross_entropy(h W^T, y),
// computed a chunk of the (N, V) logits at a time. Each chunk's logits are made (in fp32), turned into
// the loss and into the gradients of h and W (softmax minus one-hot), and dropped, so the logits never
// exist whole: for a Llama 3 vocabulary (V = 128256) and 4096 tokens that is 2 GiB of fp32 logits,
// their softmax and its gradient not held. Two ways to chunk, one kernel per device:
//   - token chunks (the host and reference providers, model/kernels/provider.h): `rows` tokens
//     against the whole vocabulary, oneDNN's products on the host; the weight's gradient is summed
//     over the chunks in fp32.
//   - vocabulary chunks (the portable provider: a GPU's, the meta device's): blocks of tokens against
//     chunks of the vocabulary in two passes (log-sum-exp first, then the gradient, the logits made
//     twice); each chunk's rows of the weight's gradient are one product over all the block's tokens,
//     written once, so no (V, C) fp32 sum is read and written once per chunk (on a GPU that sum was
//     most of the head's time: 15 passes over 1 GiB a step at the 1B shape).
// The gradients are what autograd would compute (fp32 accumulation); backward only scales them by
// the incoming gradient.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fsdp::model {

struct TensorParallel;

enum class LossChunking { kAuto, kTokens, kVocabulary };  // kAuto: the vocabulary for the portable provider

// Tokens per chunk of the token-chunked loss when rows <= 0: about 32M logits (128 MiB in fp32) a chunk.
int64_t default_chunk_rows(int64_t vocab_size);

// The bytes the loss holds beyond its inputs while it runs by token chunks or not, for `tokens`
// tokens of width `hidden` against `vocab` rows in a compute dtype of `dtype_bytes`, the head's
// gradient included when it trains, and with a soft cap a chunk's slope of it (estimate-memory).
int64_t loss_working_bytes(int64_t tokens, int64_t hidden, int64_t vocab, int64_t dtype_bytes, bool token_chunks,
                           bool head_trains, bool softcap = false);

// hidden (N, C), weight (V, C) (both the compute dtype), targets (N) int64; tokens whose target is
// ignore_index count for nothing. Returns the fp32 sum. rows: tokens per chunk (by tokens) or per block
// (by the vocabulary); vocab_rows: vocabulary rows per chunk (by the vocabulary); <= 0 picks them (about
// 32M logits a chunk; blocks whose fp32 gradient of hidden is at most 256 MiB).
// With `tp` (model/parallel/tensor_parallel.h), weight is this rank's vocabulary rows, [first_row, first_row +
// weight.size(0)) of the whole (padding left out), every rank of the group passes the same hidden
// and targets and gets the same sum (two small collectives a chunk, or a block), and the gradient of hidden is
// this rank's part: the caller sums it over the group.
// softcap > 0 (Gemma's final_logit_softcapping): each logit z is cap tanh(z / cap) before the softmax,
// in fp32, a chunk at a time as the rest, under tensor parallel too.
at::Tensor chunked_linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight,
                                            const at::Tensor& targets, int64_t rows = 0, int64_t ignore_index = -100,
                                            const TensorParallel* tp = nullptr, int64_t first_row = 0,
                                            LossChunking how = LossChunking::kAuto, int64_t vocab_rows = 0,
                                            double softcap = 0);

}  // namespace fsdp::model

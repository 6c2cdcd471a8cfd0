// The language-model loss without the full logits: sum over tokens of cross_entropy(h W^T, y),
// computed `rows` tokens at a time. Each chunk's logits are made (in fp32), turned into the loss
// and into the gradients of h and W (softmax minus one-hot), and dropped, so the (N, V) logits
// never exist whole: for a Llama 3 vocabulary (V = 128256) and 4096 tokens that is 2 GiB of fp32
// logits, their softmax and its gradient not held. The gradients are what autograd would compute
// (fp32 accumulation for W); backward only scales them by the incoming gradient.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fsdp::model {

struct TensorParallel;

// Tokens per chunk when rows <= 0: about 32M logits (128 MiB in fp32) a chunk.
int64_t default_chunk_rows(int64_t vocab_size);

// hidden (N, C), weight (V, C) (both the compute dtype), targets (N) int64; tokens whose target is
// ignore_index count for nothing. Returns the fp32 sum. rows <= 0 picks chunks of about 32M logits.
// With `tp` (model/tensor_parallel.h), weight is this rank's vocabulary rows, [first_row, first_row +
// weight.size(0)) of the whole (padding left out), every rank of the group passes the same hidden
// and targets and gets the same sum (two small collectives a chunk), and the gradient of hidden is
// this rank's part: the caller sums it over the group.
at::Tensor chunked_linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight,
                                            const at::Tensor& targets, int64_t rows = 0, int64_t ignore_index = -100,
                                            const TensorParallel* tp = nullptr, int64_t first_row = 0);

}  // namespace fsdp::model

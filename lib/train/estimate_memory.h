// `fsdptrain estimate-memory`: per-rank memory of the configured model, batch and FSDP settings,
// before anything runs. The persistent part (fp32 shards, gradients, AdamW state) is computed from
// the same unit plan and shard layout the engine uses, so it equals what a run reports; gathered
// units and activations are estimates (formulas in the .cpp).
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "model/config/hf_config.h"

namespace fsdp::train {

struct MemoryEstimate {
  int64_t params = 0, grads = 0, optimizer = 0;  // persistent, per rank (host memory with offload)
  int64_t gathered = 0;                          // unsharded units and reduction buffers at the peak
  int64_t post_forward = 0;  // reshard_after_forward=N: every unit's 1/N share kept from forward to backward
  // Bytes one rank receives in one micro-batch's collectives: forward's all-gathers (over the shard
  // group), backward's re-gathers (over the N ranks of a post-forward group under partial
  // resharding; none without reshard_after_forward) and the reduce-scatters.
  // Under float8 all-gather (engine.float8: tensorwise over more than one rank) the float8 weights
  // count one byte an element there and in `gathered`; float8_weights says how many there are.
  int64_t forward_gather_bytes = 0, backward_gather_bytes = 0, reduce_bytes = 0;
  int64_t float8_weights = 0;
  // Tensor parallel: what one rank receives in a micro-batch's sequence-parallel gathers and
  // reduce-scatters of activations, forward and backward (0 without tp).
  int64_t tp_bytes = 0;
  // Context or Ulysses sequence parallel: what one rank sends (and receives) in a micro-batch's
  // exchanges of K/V (or all-to-alls around attention), forward and backward (0 without them):
  // model::sequence_split_bytes for every layer.
  int64_t cp_bytes = 0;
  // Expert parallel: what one rank sends in a micro-batch's row exchanges (each sparse layer's rows
  // to their experts and back, forward and backward) when the router spreads them evenly: each rank
  // sends (ep-1)/ep of its k copies of every token; routing makes the real figure vary.
  int64_t ep_bytes = 0;
  int64_t activations = 0, activations_checkpointed = 0;  // one micro-batch
  int64_t trainable = 0;                                  // parameters with gradients (all but LoRA's frozen base)
  // With offload: every unit's shard in the compute dtype, kept on the device between its upload and
  // its next update (engine.offload_keep_on_device).
  int64_t offload_kept = 0;
  int64_t persistent() const { return params + grads + optimizer; }
};

MemoryEstimate estimate_memory(const config::Config& config, const model::DecoderConfig& model, int world_size);

// Refuses (InputError), before any worker starts and before anything is built, a model whose fp32
// shards, gradients and AdamW state (under LoRA: its frozen shards) alone need more memory per rank than this machine
// has for each of its `local_workers` (GPU memory on a GPU run, else host memory), naming the model, the bytes per rank
// and what the machine has. Arithmetic only: safe for any sizes config.json holds.
void check_fits_machine(const config::Config& config, const model::DecoderConfig& model, const std::string& where,
                        int local_workers);

// The report `fsdptrain estimate-memory` prints.
std::string format_memory_estimate(const config::Config& config, const model::DecoderConfig& model, int world_size);

}  // namespace fsdp::train

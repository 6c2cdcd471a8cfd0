// When attention takes a GPU's flash kernels: the one rule the decoder (variable-length flash
// attention for packed rows) and context parallel (each block's flash forward and backward) ask.
#pragma once

#include <ATen/core/Tensor.h>

namespace fsdp::model::kernels {

// Whether q (B, H, T, D) takes LibTorch's CUDA flash attention: on a CUDA device under the portable
// provider (engine.kernels auto there; reference never does), in bf16 or fp16, with D a multiple of
// 8 up to 256 (the kernel's head sizes). Elsewhere attention takes SDPA's other kernels or ATen's
// ops one by one.
bool flash_attention_applies(const at::Tensor& q);

}  // namespace fsdp::model::kernels

// When attention takes a GPU's flash kernels: the one rule the portable provider (model/kernels/ops.h)
// asks for the decoder's packed rows (variable-length flash attention) and context parallel's blocks.
#pragma once

#include <ATen/core/Tensor.h>

namespace fsdp::model::kernels {

// Whether q (B, H, T, D) can take LibTorch's CUDA flash attention: on a CUDA device, in bf16 or fp16,
// with D a multiple of 8 up to 256 (the kernel's head sizes). Elsewhere attention takes SDPA's other
// kernels or ATen's ops one by one.
bool flash_attention_applies(const at::Tensor& q);

}  // namespace fsdp::model::kernels

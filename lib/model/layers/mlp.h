// The dense feed-forward: down(act(gate(x)) * up(x)), act SiLU (SwiGLU) or GELU's tanh form
// (GeGLU), as the config's hidden_act says. Not thread-safe (LibTorch modules).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "model/config/hf_config.h"
#include "model/layers/lora_layer.h"

namespace fsdp::model {

struct TensorParallel;  // model/parallel/tensor_parallel.h

class GatedMlpImpl : public torch::nn::Module {
 public:
  // With `tp`: this rank's F/P rows of gate and up, the matching columns of down; forward takes and
  // returns this rank's block of the sequence. intermediate: F when not the config's (Qwen2-MoE's shared expert).
  explicit GatedMlpImpl(const DecoderConfig& c, std::shared_ptr<TensorParallel> tp = nullptr, int64_t intermediate = 0);
  at::Tensor forward(const at::Tensor& x);  // down(act(gate(x)) * up(x)), act SiLU or GELU's tanh form
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  FusedLora gate_up_proj{nullptr};  // LoRA on a checkpoint's fused gate/up (Phi-3), added by add_lora
  std::shared_ptr<TensorParallel> tp;
  Activation activation;
};
TORCH_MODULE(GatedMlp);

}  // namespace fsdp::model

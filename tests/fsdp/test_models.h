// Small models for the FSDP engine's tests. Every dim 0 is chosen not to divide by 2, 3 or 4, so
// shards are padded and some ranks hold only padding; the transformer ties its embedding to its
// LM head (two modules register one tensor); both have frozen parameters.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <string>

#include "fsdp/unit_call.h"

namespace fsdp::testing {

// --- a stack of residual MLP blocks (regression) ---------------------------------------------

struct MlpBlockImpl : torch::nn::Module {
  MlpBlockImpl(int64_t dim, int64_t hidden) : torch::nn::Module("MlpBlock") {
    fc1 = register_module("fc1", torch::nn::Linear(dim, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, dim));
  }
  at::Tensor forward(const at::Tensor& x) { return x + fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(MlpBlock);

struct MlpStackImpl : torch::nn::Module {
  static constexpr int64_t kIn = 5, kDim = 7, kHidden = 13, kOut = 3;
  // frozen_block < 0: everything trains. dim/hidden: larger stacks for timing.
  explicit MlpStackImpl(int blocks = 4, int frozen_block = 2, int64_t dim = kDim, int64_t hidden = kHidden)
      : torch::nn::Module("MlpStack") {
    in_proj = register_module("in_proj", torch::nn::Linear(kIn, dim));
    layers = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < blocks; ++i) {
      MlpBlock b(dim, hidden);
      if (i == frozen_block)
        for (auto& p : b->parameters()) p.set_requires_grad(false);
      layers->push_back(b);
    }
    head = register_module("head", torch::nn::Linear(dim, kOut));
  }
  // x: (B, kIn) -> (B, kOut)
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = in_proj(x);
    for (const auto& m : *layers) {
      auto* block = m->as<MlpBlockImpl>();
      h = fsdp::call(*block, h, [block](const at::Tensor& in) { return block->forward(in); });
    }
    return head(h);
  }
  static ModelTraits traits() { return ModelTraits{{"MlpBlock"}, {"MlpBlock"}}; }
  torch::nn::Linear in_proj{nullptr}, head{nullptr};
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(MlpStack);

// --- a tiny causal transformer (language modelling) --------------------------------------------

struct RmsNormImpl : torch::nn::Module {
  explicit RmsNormImpl(int64_t dim) : torch::nn::Module("RmsNorm") {
    weight = register_parameter("weight", torch::ones({dim}));
  }
  at::Tensor forward(const at::Tensor& x) {
    return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + 1e-6) * weight;
  }
  at::Tensor weight;
};
TORCH_MODULE(RmsNorm);

struct TinyAttentionImpl : torch::nn::Module {
  explicit TinyAttentionImpl(int64_t dim) : torch::nn::Module("TinyAttention") {
    qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(dim, 3 * dim).bias(false)));
    proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(dim, dim).bias(false)));
  }
  at::Tensor forward(const at::Tensor& x) {  // (B, T, C), one head
    auto parts = qkv(x).chunk(3, -1);
    const int64_t t = x.size(1);
    at::Tensor scores = torch::matmul(parts[0], parts[1].transpose(1, 2)) / std::sqrt(static_cast<double>(x.size(2)));
    // On the scores' device: a host mask met a CUDA tensor the first time this ran on a GPU.
    at::Tensor mask = torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    scores = scores.masked_fill(mask, -1e4);
    return proj(torch::matmul(torch::softmax(scores, -1), parts[2]));
  }
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(TinyAttention);

struct TinyMlpImpl : torch::nn::Module {
  TinyMlpImpl(int64_t dim, int64_t hidden) : torch::nn::Module("TinyMlp") {
    fc1 = register_module("fc1", torch::nn::Linear(dim, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, dim));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::gelu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TinyMlp);

struct TinyBlockImpl : torch::nn::Module {
  TinyBlockImpl(int64_t dim, int64_t hidden) : torch::nn::Module("TinyBlock") {
    norm1 = register_module("norm1", RmsNorm(dim));
    attn = register_module("attn", TinyAttention(dim));
    norm2 = register_module("norm2", RmsNorm(dim));
    mlp = register_module("mlp", TinyMlp(dim, hidden));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x + fsdp::call(*attn, norm1(x), [this](const at::Tensor& in) { return attn->forward(in); });
    return h + fsdp::call(*mlp, norm2(h), [this](const at::Tensor& in) { return mlp->forward(in); });
  }
  RmsNorm norm1{nullptr}, norm2{nullptr};
  TinyAttention attn{nullptr};
  TinyMlp mlp{nullptr};
};
TORCH_MODULE(TinyBlock);

struct TokenEmbeddingImpl : torch::nn::Module {
  TokenEmbeddingImpl(int64_t vocab, int64_t dim) : torch::nn::Module("TokenEmbedding") {
    weight = register_parameter("weight", torch::randn({vocab, dim}) * 0.5);
  }
  at::Tensor forward(const at::Tensor& tokens) {
    return weight.index_select(0, tokens.reshape({-1})).view({tokens.size(0), tokens.size(1), -1});
  }
  at::Tensor weight;
};
TORCH_MODULE(TokenEmbedding);

// Registers the embedding's tensor as its own weight: one parameter, two modules.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const at::Tensor& tied) : torch::nn::Module("TiedHead") {
    weight = register_parameter("weight", tied);
  }
  at::Tensor forward(const at::Tensor& x) { return torch::matmul(x, weight.t()); }
  at::Tensor weight;
};
TORCH_MODULE(TiedHead);

struct TinyTransformerImpl : torch::nn::Module {
  static constexpr int64_t kVocab = 13, kDim = 6, kHidden = 10, kSeq = 5;
  explicit TinyTransformerImpl(int blocks = 2) : torch::nn::Module("TinyTransformer") {
    embed = register_module("embed", TokenEmbedding(kVocab, kDim));
    layers = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < blocks; ++i) layers->push_back(TinyBlock(kDim, kHidden));
    // Block 0's attention is frozen: its unit mixes frozen and trainable parameters (the LoRA case).
    for (auto& p : layers[0]->as<TinyBlockImpl>()->attn->parameters()) p.set_requires_grad(false);
    norm = register_module("norm", RmsNorm(kDim));
    lm_head = register_module("lm_head", TiedHead(embed->weight));
  }
  // tokens: (B, T) int64 -> logits (B, T, kVocab)
  at::Tensor forward(const at::Tensor& tokens) {
    at::Tensor x = fsdp::call(*embed, tokens, [this](const at::Tensor& t) { return embed->forward(t); });
    for (const auto& m : *layers) {
      auto* block = m->as<TinyBlockImpl>();
      x = fsdp::call(*block, x, [block](const at::Tensor& in) { return block->forward(in); });
    }
    return lm_head(norm(x));
  }
  static ModelTraits traits() {
    return ModelTraits{{"TinyBlock"}, {"TinyBlock", "TinyAttention", "TinyMlp", "TokenEmbedding"}};
  }
  TokenEmbedding embed{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RmsNorm norm{nullptr};
  TiedHead lm_head{nullptr};
};
TORCH_MODULE(TinyTransformer);

}  // namespace fsdp::testing

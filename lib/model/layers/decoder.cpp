#include "model/layers/decoder.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "fsdp/param_group.h"
#include "fsdp/unit_call.h"
#include "model/kernels/float8.h"
#include "model/kernels/linear.h"
#include "model/layers/chunked_loss.h"
#include "model/layers/lora_layer.h"
#include "model/layers/projection.h"
#include "model/parallel/context_parallel.h"
#include "model/parallel/expert_parallel.h"
#include "model/parallel/tensor_parallel.h"
#include "util/error.h"
#include "util/log.h"
#include "util/splitmix.h"
#include "util/strings.h"

namespace fsdp::model {

namespace {

// Values [begin, begin + count) of an N(0, std) tensor of n values drawn in blocks of 2^20, each
// block (its length min(2^20, n - its start)) from its own generator, seeded by the parameter's
// stream and the block's index (mixed as SplitMix64 does, since a generator keeps 32 bits of its
// seed): a value depends on the seed, the name, n and its index alone, never on the thread count
// or on which range is asked for, so each rank draws only its shard's blocks, on every core. One
// generator for the whole tensor drew the ~1B Llama's 1.24B values on one core (about 6 s) on
// every rank before the first step.
at::Tensor normal_range(uint64_t stream, double std, int64_t n, int64_t begin, int64_t count) {
  at::Tensor out = at::empty({count}, at::kFloat);
  if (count == 0) return out;
  const int64_t block = int64_t{1} << 20, first = begin / block, last = (begin + count - 1) / block;
  float* data = out.data_ptr<float>();
  at::parallel_for(first, last + 1, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      // SplitMix64's output b + 1 from the stream
      const uint64_t seed = splitmix64_mix(stream + kSplitMixStep * static_cast<uint64_t>(b + 1));
      at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
      const int64_t lo = b * block, len = std::min(block, n - lo);
      const int64_t from = std::max(lo, begin), to = std::min(lo + len, begin + count);
      if (from == lo && to == lo + len) {  // the whole block is wanted: drawn in place
        at::from_blob(data + (lo - begin), {len}, at::kFloat).normal_(0.0, std, g);
        continue;
      }
      const at::Tensor whole = at::empty({len}, at::kFloat).normal_(0.0, std, g);
      std::copy_n(whole.data_ptr<float>() + (from - lo), to - from, data + (from - begin));
    }
  });
  return out;
}

}  // namespace

DecoderLayerImpl::DecoderLayerImpl(const DecoderConfig& c, int64_t layer, std::shared_ptr<TensorParallel> tp,
                                   std::shared_ptr<ContextParallel> cp, std::shared_ptr<ExpertParallel> ep)
    : torch::nn::Module(family_names(c.family).layer_class),
      norms(c.norms),
      residual_multiplier(c.residual_multiplier),
      activation(c.activation) {
  const bool sparse = c.plan(layer).moe;
  if (c.plan(layer).linear) {
    const char* arch = family_names(c.family).architecture;
    FSDP_CHECK(!cp || cp->ulysses(), "[model] ", arch,
               ": a Gated DeltaNet (linear attention) layer carries its state along the sequence, which context "
               "parallel's all-gather and ring strategies split; use Ulysses (parallelism_config_sp_size), which "
               "gives each rank every token of a share of the heads");
    linear_attn = register_module("linear_attn", GatedDeltaNet(c, tp, cp));
  } else {
    self_attn = register_module("self_attn", Attention(c, layer, tp, std::move(cp)));
  }
  const bool beside = sparse && c.moe.gemma4;  // Gemma 4's experts beside the dense MLP
  if (sparse && !beside)
    moe = register_module("mlp", MoeBlock(c, std::move(ep)));
  else
    mlp = register_module("mlp", GatedMlp(c, tp, c.plan(layer).mlp_width));
  if (beside) {  // the block itself is not registered: its router and experts are the layer's
    moe = MoeBlock(c, std::move(ep));
    register_module("router", moe->router);
    register_module("experts", moe->experts);
  }
  // In layer_norm_names' order (describe() lists them so; decoder_test holds the two together).
  auto add = [&](const char* name) { return register_module(name, norm_of(c, c.hidden_size)); };
  if (norms != NormPlacement::kPost) input_layernorm = add("input_layernorm");
  post_attention_layernorm = add("post_attention_layernorm");
  if (norms == NormPlacement::kSandwich) pre_feedforward_layernorm = add("pre_feedforward_layernorm");
  if (norms != NormPlacement::kPre) post_feedforward_layernorm = add("post_feedforward_layernorm");
  if (beside) {  // kGemma4MoeNorms' order
    FSDP_CHECK(norms == NormPlacement::kSandwich, "Gemma 4's experts take sandwich norms");
    post_feedforward_layernorm_1 = add(kGemma4MoeNorms[0]);
    post_feedforward_layernorm_2 = add(kGemma4MoeNorms[1]);
    pre_feedforward_layernorm_2 = add(kGemma4MoeNorms[2]);
  }
  if (const int64_t p = c.per_layer_input_dim; p > 0) {  // describe() lists them in this order
    per_layer_input_gate = register_module("per_layer_input_gate", uninitialized_linear(c.hidden_size, p, false));
    per_layer_projection = register_module("per_layer_projection", uninitialized_linear(p, c.hidden_size, false));
    post_per_layer_input_norm = add("post_per_layer_input_norm");
  }
  if (c.layer_scalar) layer_scalar = register_parameter("layer_scalar", at::ones({1}), /*requires_grad=*/false);
}

// As Gemma4TextDecoderLayer: after the MLP's residual sum, before the layer's scalar.
at::Tensor DecoderLayerImpl::with_per_layer_input(const at::Tensor& h, const at::Tensor& input) {
  if (!per_layer_input_gate) return h;
  FSDP_ASSERT(input.defined(), "a layer with per-layer embeddings is given its input");
  const at::Tensor g = lora_linear(per_layer_input_gate, h);
  const at::Tensor a = activation == Activation::kSilu ? at::silu(g) : at::gelu(g, "tanh");
  return h + post_per_layer_input_norm(lora_linear(per_layer_projection, a * input));
}

at::Tensor DecoderLayerImpl::scaled(const at::Tensor& y) const {
  return layer_scalar.defined() ? y * layer_scalar.to(y.scalar_type()) : y;
}

at::Tensor DecoderLayerImpl::residual(const at::Tensor& x, const at::Tensor& y) const {
  return residual_multiplier == 1.0 ? x + y : x + y * residual_multiplier;
}

at::Tensor DecoderLayerImpl::feed_forward(const at::Tensor& h) {
  return moe ? moe->forward(h) : mlp->forward(h);
}

// As Gemma4TextDecoderLayer: the experts route by the layer's input h and take their own norm of it.
at::Tensor DecoderLayerImpl::mlp_and_experts(const at::Tensor& h) {
  const at::Tensor dense = post_feedforward_layernorm_1(mlp->forward(pre_feedforward_layernorm(h)));
  return dense + post_feedforward_layernorm_2(moe->forward(pre_feedforward_layernorm_2(h), h));
}

// The MLP's half of the layer. Pre: post_attention_layernorm is the MLP's input norm.
at::Tensor DecoderLayerImpl::mlp_part(const at::Tensor& h) {
  switch (norms) {
    case NormPlacement::kPre:
      return residual(h, feed_forward(post_attention_layernorm(h)));
    case NormPlacement::kPost:
      return residual(h, post_feedforward_layernorm(feed_forward(h)));
    case NormPlacement::kSandwich:
      break;
  }
  if (moe && mlp) return residual(h, post_feedforward_layernorm(mlp_and_experts(h)));
  return residual(h, post_feedforward_layernorm(feed_forward(pre_feedforward_layernorm(h))));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     const Packed& packed, const at::Tensor& per_layer_input, const KeysValues* shared,
                                     KeysValues* kept) {
  const at::Tensor in = input_layernorm ? input_layernorm(x) : x;
  at::Tensor y =
      linear_attn ? linear_attn->forward(in, packed) : self_attn->forward(in, cos, sin, packed, shared, kept);
  if (norms != NormPlacement::kPre) y = post_attention_layernorm(y);
  return scaled(with_per_layer_input(mlp_part(residual(x, y)), per_layer_input));
}

at::Tensor DecoderLayerImpl::forward_cached(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                            LayerCache& cache, const at::Tensor& per_layer_input,
                                            const LayerCache* shared) {
  const at::Tensor in = input_layernorm ? input_layernorm(x) : x;
  at::Tensor y =
      linear_attn ? linear_attn->forward_cached(in, cache) : self_attn->forward_cached(in, cos, sin, cache, shared);
  if (norms != NormPlacement::kPre) y = post_attention_layernorm(y);
  return scaled(with_per_layer_input(mlp_part(residual(x, y)), per_layer_input));
}

TokenEmbeddingImpl::TokenEmbeddingImpl(int64_t vocab, int64_t dim, std::shared_ptr<TensorParallel> t, int64_t pad,
                                       const char* name)
    : torch::nn::Module(name), tp(std::move(t)), padding_idx(pad) {
  weight = register_parameter("weight", at::empty({tp ? vocab_block(vocab, tp->size()) : vocab, dim}));
}

at::Tensor TokenEmbeddingImpl::forward(const at::Tensor& tokens) {
  if (!tp) return at::embedding(weight, tokens, padding_idx);
  return reduce_scatter_along(vocab_parallel_embedding(weight, tokens, *tp, padding_idx), 1, *tp);
}

DecoderImpl::DecoderImpl(const DecoderConfig& c, std::shared_ptr<TensorParallel> tp) : torch::nn::Module("Decoder") {
  embed_tokens = register_module("embed_tokens", TokenEmbedding(c.vocab_size, c.hidden_size, tp, c.pad_token_id));
  layers = register_module("layers", torch::nn::ModuleList());
  norm = register_module("norm", norm_of(c, c.hidden_size));
  if (const int64_t p = c.per_layer_input_dim; p > 0) {
    const int64_t width = c.num_hidden_layers * p;
    embed_tokens_per_layer =
        register_module("embed_tokens_per_layer",
                        TokenEmbedding(c.per_layer_vocab, width, nullptr, c.pad_token_id, "PerLayerEmbedding"));
    per_layer_model_projection =
        register_module("per_layer_model_projection", uninitialized_linear(c.hidden_size, width, false));
    per_layer_projection_norm = register_module("per_layer_projection_norm", norm_of(c, p));
  }
}

CausalLMImpl::CausalLMImpl(const DecoderConfig& c, bool free_after_create, std::shared_ptr<TensorParallel> t,
                           std::shared_ptr<ContextParallel> s, std::shared_ptr<ExpertParallel> e)
    : torch::nn::Module("CausalLM"),
      config(c),
      tp(t && t->size() > 1 ? std::move(t) : nullptr),
      cp(s && s->size() > 1 ? std::move(s) : nullptr),
      ep(e && e->size() > 1 ? std::move(e) : nullptr) {
  FSDP_CHECK(!ep || c.moe.num_experts > 0, "[config] parallelism_config_ep_size ", ep ? ep->size() : 1,
             ": ", family_names(c.family).architecture, " is a dense model (no experts to split); set "
             "parallelism_config_ep_size: 1");
  // Gemma 4 E2B/E4B (the launcher says so first). Context and sequence parallel split them as they are: the
  // per-layer inputs are each token's own, and a layer sharing keys and values takes its source's share of
  // them (this rank's tokens, or its heads after Ulysses' swap) and reaches the rest as its source does.
  if (const std::string parts = tensor_parallel_unsplit_parts(c); !parts.empty())
    FSDP_CHECK(!tp, "[tp] ", family_names(c.family).architecture, "'s ", parts,
               ", Gemma 4 E2B's and E4B's, are not split by tensor parallel; set parallelism_config_tp_size: 1 (FSDP "
               "shards the model; context or sequence parallel split its sequences)");
  auto release = [&](torch::nn::Module& m) {
    if (free_after_create)
      for (auto& p : m.parameters()) fsdp::free_storage(p);
  };
  model = register_module("model", Decoder(c, tp));
  release(*model);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {  // one layer exists at a time
    DecoderLayer layer(c, i, tp, cp, ep);
    release(*layer);
    model->layers->push_back(layer);
  }
  if (!c.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head", uninitialized_linear(c.hidden_size, tp ? vocab_block(c.vocab_size, tp->size()) : c.vocab_size,
                                        /*bias=*/false));
    release(*lm_head);
  }
  // Buffers, so they move with the model (fully_shard, Module::to) and no forward copies them from the host.
  inv_freq_.push_back(register_buffer("inv_freq", rope_inv_freq(c)));
  if (c.local_rope_theta > 0) inv_freq_.push_back(register_buffer("inv_freq_local", rope_inv_freq(c, true)));
  if (c.rope_scaling && c.rope_scaling->type == RopeScaling::Type::kLongRope)  // past original_max_position_embeddings
    inv_freq_.push_back(register_buffer("inv_freq_long",
                                        rope_inv_freq(c, false, c.rope_scaling->original_max_position_embeddings + 1)));
}

// As Gemma4TextModel's get_per_layer_inputs and project_per_layer_inputs: the table's rows times
// sqrt(P) (rounded to the dtype, as transformers scales), and the embedding's projection times C^-1/2
// normed over P, summed, times 2^-1/2. The table is a unit of its own when sharded.
at::Tensor CausalLMImpl::per_layer_inputs(const at::Tensor& tokens, const at::Tensor& x) {
  const int64_t p = config.per_layer_input_dim;
  const std::vector<int64_t> shape = {x.size(0), x.size(1), config.num_hidden_layers, p};
  TokenEmbeddingImpl* table = model->embed_tokens_per_layer.get();
  const at::Tensor rows = fsdp::call(*table, tokens, [table](const at::Tensor& t) { return table->forward(t); });
  const at::Tensor looked = rows * at::scalar_tensor(std::sqrt(static_cast<double>(p)), rows.options());
  const at::Tensor projected =
      lora_linear(model->per_layer_model_projection, x) * (1.0 / std::sqrt(static_cast<double>(config.hidden_size)));
  return (model->per_layer_projection_norm(projected.reshape(shape)) + looked.reshape(shape)) * std::sqrt(0.5);
}

at::Tensor CausalLMImpl::embed(const at::Tensor& tokens) {
  TokenEmbeddingImpl* e = model->embed_tokens.get();
  // Tied: the embedding also computes the logits, so it stays in the root with the head.
  const at::Tensor x = config.tie_word_embeddings
                           ? e->forward(tokens)
                           : fsdp::call(*e, tokens, [e](const at::Tensor& t) { return e->forward(t); });
  if (config.embedding_scale == 1.0) return x;
  // Gemma: sqrt(hidden_size) rounded to the activations' dtype first, as transformers does.
  if (config.embed_scale_in_dtype) return x * at::scalar_tensor(config.embedding_scale, x.options());
  return x * config.embedding_scale;
}

std::vector<at::Tensor> CausalLMImpl::inv_freq_for(int64_t seq_len, const at::Tensor& like) const {
  std::vector<at::Tensor> out(inv_freq_.begin(), inv_freq_.begin() + (config.local_rope_theta > 0 ? 2 : 1));
  if (!rope_depends_on_length(config, seq_len)) return out;
  // Past its original positions longrope takes its long table (a buffer); past max_position_embeddings
  // dynamic's base grows with the length (computed on the model's device).
  out[0] = config.rope_scaling->type == RopeScaling::Type::kLongRope
               ? inv_freq_.back()
               : rope_inv_freq(config, false, seq_len, like.device());
  return out;
}

CausalLMImpl::Angles CausalLMImpl::angles(int64_t seq_len, const at::Tensor& like) const {
  Angles out;
  const double factor = config.rope_attention_factor();
  const std::vector<at::Tensor> freqs = inv_freq_for(seq_len, like);
  for (size_t i = 0; i < freqs.size(); ++i)  // the local table (Gemma 3's) is never scaled
    out.push_back(rope_cos_sin(freqs[i], seq_len, like, i == 0 ? factor : 1.0));
  return out;
}

at::Tensor CausalLMImpl::logits_of(const at::Tensor& h) {
  at::Tensor logits = model::linear(h, head_weight());
  if (config.logits_scaling != 1.0) logits = logits / config.logits_scaling;
  if (config.final_softcap > 0) logits = at::tanh(logits / config.final_softcap) * config.final_softcap;
  return logits;
}

namespace {

std::vector<const RouterStats*> router_stats(const Decoder& model) {
  std::vector<const RouterStats*> out;
  for (const auto& layer : *model->layers)
    if (const auto& moe = layer->as<DecoderLayerImpl>()->moe) out.push_back(&moe->last);
  return out;
}

// The last forward's auxiliary loss of the whole sequences (per_expert: its gradient, optional).
// Context and tensor parallel split each sequence's tokens over their groups (each rank routes its
// own): load_balancing_loss sums the counts over them, times cp_size for cp's averaged gradients.
at::Tensor whole_sequence_aux_loss(const CausalLMImpl& m, at::Tensor* per_expert = nullptr) {
  std::vector<dist::ProcessGroup*> split;
  if (m.cp) split.push_back(&*m.cp->group);
  if (m.tp) split.push_back(&*m.tp->group);
  return load_balancing_loss(router_stats(m.model), m.config.moe.num_experts, split, m.cp ? m.cp->size() : 1.0,
                             per_expert);
}

}  // namespace

at::Tensor CausalLMImpl::router_aux_loss() const {
  return whole_sequence_aux_loss(*this);
}

void CausalLMImpl::aux_loss_in_backward() {
  aux_gradient_ = std::make_shared<RouterAuxGradient>();
  for (const auto& layer : *model->layers)
    if (MoeBlock moe = layer->as<DecoderLayerImpl>()->moe) moe->aux_gradient = aux_gradient_;
}

at::Tensor CausalLMImpl::router_aux_gradient(double scale) {
  FSDP_ASSERT(aux_gradient_ != nullptr, "router_aux_gradient without aux_loss_in_backward");
  at::Tensor per_expert;
  const at::Tensor aux = whole_sequence_aux_loss(*this, &per_expert);
  aux_gradient_->per_expert = per_expert.defined() ? per_expert * scale : at::Tensor();
  return aux.defined() ? aux.detach() : aux;
}

at::Tensor CausalLMImpl::expert_load() const {
  at::Tensor out;
  for (const RouterStats* s : router_stats(model))
    if (s->routed_per_expert.defined())
      out = out.defined() ? out + s->routed_per_expert : s->routed_per_expert;
  return out;
}

std::vector<MoeBlockImpl*> CausalLMImpl::sparse_blocks() const {
  std::vector<MoeBlockImpl*> out;
  for (const auto& layer : *model->layers)
    if (MoeBlock moe = layer->as<DecoderLayerImpl>()->moe) out.push_back(moe.get());
  return out;
}

namespace {

// Ministral 3 beyond its unscaled positions (DecoderConfig::query_scale_positions): refused, never computed wrong.
void check_positions_computed(const DecoderConfig& c, int64_t length) {
  FSDP_CHECK(c.query_scale_beta <= 0 || length <= c.query_scale_positions, "[model] ", length,
             " positions: ", family_names(c.family).architecture, " scales its queries past position ",
             c.query_scale_positions,
             " (rope_parameters' llama_4_scaling_beta), which fsdptrain does not compute; keep sequences to ",
             c.query_scale_positions, " tokens");
}

// DeepSeek-V2 rotates in fp32 whatever the compute dtype (LatentAttention::fp32_rotation): its tables are made in fp32
// and travel into the layers as one complex tensor, cos + i sin, in both places of the pair, which fsdp::call's cast of
// floating inputs to the compute dtype lets pass (AttentionImpl::project_latent takes it apart).
bool rotates_in_fp32(const DecoderConfig& c) {
  return c.latent() && c.mla.fp32_rotation;
}

// The tables' dtype: the activations', or fp32 for DeepSeek-V2 (rotates_in_fp32).
at::Tensor table_like(const DecoderConfig& c, const at::Tensor& x) {
  return rotates_in_fp32(c) ? at::empty({0}, x.options().dtype(at::kFloat)) : x;
}

void as_complex(std::vector<std::pair<at::Tensor, at::Tensor>>& tables) {
  for (auto& [cos, sin] : tables) {
    cos = at::view_as_complex(at::stack({cos, sin}, -1));
    sin = cos;
  }
}

}  // namespace

at::Tensor CausalLMImpl::hidden_states(const at::Tensor& all_tokens, const Packed& packed) {
  check_positions_computed(config, all_tokens.size(1));
  // Under context parallel, this rank's tokens of each sequence, and their positions' angles.
  const at::Tensor mine = cp ? sequence_positions(all_tokens.size(1), *cp, all_tokens.device()) : at::Tensor();
  const at::Tensor tokens = cp ? all_tokens.index_select(1, mine) : all_tokens;
  at::Tensor x = embed(tokens);
  const Packed rows = packed.defined() ? packed.to(x.device()) : Packed{};
  const at::Tensor like = table_like(config, x);
  Angles tables;
  if (rows.defined()) {
    const at::Tensor positions = cp ? rows.positions.index_select(1, mine.to(x.device())) : rows.positions;
    // As transformers: the table for the longest record's length (its largest position + 1).
    int64_t longest = all_tokens.size(1);
    if (rope_depends_on_length(config, longest))
      longest = packed.max_len > 0 ? packed.max_len : packed.positions.max().item<int64_t>() + 1;
    const std::vector<at::Tensor> freqs = inv_freq_for(longest, x);
    for (size_t f = 0; f < freqs.size(); ++f)
      tables.push_back(rope_cos_sin_at(freqs[f], positions, like, f == 0 ? config.rope_attention_factor() : 1.0));
  } else {
    tables = angles(all_tokens.size(1), like);
  }
  if (cp && !rows.defined())
    for (auto& [cos, sin] : tables) {
      cos = cos.index_select(0, mine.to(x.device()));
      sin = sin.index_select(0, mine.to(x.device()));
    }
  if (rotates_in_fp32(config)) as_complex(tables);
  const at::Tensor per_layer = config.per_layer_input_dim > 0 ? per_layer_inputs(tokens, x) : at::Tensor();
  std::vector<KeysValues> kept(static_cast<size_t>(config.num_hidden_layers));  // what later layers take
  int64_t i = 0;
  for (const auto& m : *model->layers) {
    auto* layer = m->as<DecoderLayerImpl>();
    const LayerPlan plan = config.plan(i);
    const auto& [cos, sin] = tables[static_cast<size_t>(plan.rope)];
    // The layer's inputs: x, cos, sin, then its per-layer input and the keys and values it takes, where it
    // has them; its outputs: x, then the keys and values it keeps for a later layer.
    TensorList inputs{x, cos, sin};
    if (per_layer.defined()) inputs.push_back(per_layer.select(2, i));
    if (plan.kv_source >= 0) {
      const KeysValues& from = kept[static_cast<size_t>(plan.kv_source)];
      inputs.insert(inputs.end(), {from.k, from.v});
    }
    const bool own = per_layer.defined(), takes = plan.kv_source >= 0, keeps = plan.kv_kept;
    const TensorList out = fsdp::call(*layer, inputs, [layer, rows, own, takes, keeps](const TensorList& in) {
      const at::Tensor input = own ? in[3] : at::Tensor();
      const size_t at = own ? 4 : 3;
      const KeysValues shared = takes ? KeysValues{in[at], in[at + 1]} : KeysValues{};
      KeysValues mine;
      const at::Tensor y =
          layer->forward(in[0], in[1], in[2], rows, input, takes ? &shared : nullptr, keeps ? &mine : nullptr);
      return keeps ? TensorList{y, mine.k, mine.v} : TensorList{y};
    });
    x = out[0];
    if (keeps) kept[static_cast<size_t>(i)] = {out[1], out[2]};
    ++i;
  }
  const at::Tensor normed = model->norm(x);
  return tp ? gather_along(normed, 1, *tp) : normed;
}

const at::Tensor& CausalLMImpl::head_weight() const {
  return config.tie_word_embeddings ? model->embed_tokens->weight : lm_head->weight;
}

at::Tensor CausalLMImpl::forward(const at::Tensor& tokens) {
  FSDP_CHECK(!cp, "[model] logits of whole sequences come from a model without context or sequence parallel");
  const at::Tensor logits = logits_of(hidden_states(tokens));
  // Every rank's columns of the vocabulary, the padding past vocab_size cut off.
  return tp ? gather_along(logits, -1, *tp).narrow(-1, 0, config.vocab_size) : logits;
}

at::Tensor CausalLMImpl::forward_cached(const at::Tensor& tokens, std::vector<LayerCache>& cache) {
  FSDP_CHECK(!tp && !cp, "[model] decoding runs on a model without tensor, context or sequence parallel");
  cache.resize(static_cast<size_t>(config.num_hidden_layers));
  const int64_t start = cache[0].length, t = tokens.size(1);
  check_positions_computed(config, start + t);
  at::Tensor x = embed(tokens);
  Angles tables = angles(start + t, table_like(config, x));
  for (auto& [cos, sin] : tables) {
    cos = cos.narrow(0, start, t);
    sin = sin.narrow(0, start, t);
  }
  if (rotates_in_fp32(config)) as_complex(tables);
  const at::Tensor per_layer = config.per_layer_input_dim > 0 ? per_layer_inputs(tokens, x) : at::Tensor();
  for (size_t i = 0; i < cache.size(); ++i) {
    const LayerPlan plan = config.plan(static_cast<int64_t>(i));
    const auto& [cos, sin] = tables[static_cast<size_t>(plan.rope)];
    x = model->layers[i]->as<DecoderLayerImpl>()->forward_cached(
        x, cos, sin, cache[i], per_layer.defined() ? per_layer.select(2, static_cast<int64_t>(i)) : at::Tensor(),
        plan.kv_source >= 0 ? &cache[static_cast<size_t>(plan.kv_source)] : nullptr);
  }
  return logits_of(model->norm(x));
}

at::Tensor CausalLMImpl::loss_sum(const at::Tensor& tokens, const at::Tensor& targets, const Packed& packed) {
  at::Tensor x = hidden_states(tokens, packed).reshape({-1, config.hidden_size});
  // This rank's tokens' targets, under context parallel.
  const at::Tensor y =
      (cp ? targets.index_select(1, sequence_positions(targets.size(1), *cp, targets.device())) : targets)
          .reshape({-1});
  if (config.logits_scaling != 1.0) x = x / config.logits_scaling;  // (x / s) W^T: the logits / s
  // Gemma's final soft cap is taken chunk by chunk too (on each rank's vocabulary rows under tp).
  const double cap = config.final_softcap;
  if (!tp)
    return chunked_linear_cross_entropy_sum(x, head_weight(), y, /*rows=*/0, /*ignore_index=*/-100, nullptr, 0,
                                            LossChunking::kAuto, /*vocab_rows=*/0, cap);
  // This rank's vocabulary rows without their padding: no logit of a token that does not exist.
  const int64_t block = head_weight().size(0), first = tp->rank() * block;
  const int64_t valid = std::clamp<int64_t>(config.vocab_size - first, 0, block);
  return chunked_linear_cross_entropy_sum(x, head_weight().narrow(0, 0, valid), y, /*rows=*/0,
                                          /*ignore_index=*/-100, tp.get(), first, LossChunking::kAuto,
                                          /*vocab_rows=*/0, cap);
}

at::Tensor CausalLMImpl::loss(const at::Tensor& tokens, const at::Tensor& targets, const Packed& packed) {
  return loss_sum(tokens, targets, packed) / targets.ne(-100).sum().clamp_min(1).to(at::kFloat);
}

ModelTraits decoder_traits(const DecoderConfig& c) {
  const std::string layer = family_names(c.family).layer_class;
  ModelTraits t{{layer}, {layer}};
  if (!c.tie_word_embeddings) t.unit_classes.push_back("TokenEmbedding");
  // Gemma 4 E2B/E4B's per-layer table (vocab_size_per_layer_input x L P values): a unit of its own
  // beside the decoder layers, not gathered in the root through the whole step.
  if (c.per_layer_input_dim > 0) {
    t.separate_units.push_back("PerLayerEmbedding");
    t.unit_classes.push_back("PerLayerEmbedding");
  }
  if (c.moe.num_experts > 0) t.unit_classes.push_back("Experts");  // run through fsdp::call (expert parallel's units)
  return t;
}

std::vector<std::string> float8_weight_names(const torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_modules()) {
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    auto add = [&](std::initializer_list<std::pair<const char*, const torch::nn::Linear*>> linears) {
      for (const auto& [name, l] : linears)
        if (*l) names.push_back(prefix + name + ".weight");
    };
    const torch::nn::Module* m = item.value().get();
    if (const auto* a = dynamic_cast<const AttentionImpl*>(m))
      add({{"q_proj", &a->q_proj},
           {"k_proj", &a->k_proj},
           {"v_proj", &a->v_proj},
           {"o_proj", &a->o_proj},
           {"q_a_proj", &a->q_a_proj},  // latent attention's
           {"q_b_proj", &a->q_b_proj},
           {"kv_a_proj_with_mqa", &a->kv_a_proj},
           {"kv_b_proj", &a->kv_b_proj}});
    else if (const auto* mlp = dynamic_cast<const GatedMlpImpl*>(m))
      add({{"gate_proj", &mlp->gate_proj}, {"up_proj", &mlp->up_proj}, {"down_proj", &mlp->down_proj}});
    else if (const auto* d = dynamic_cast<const GatedDeltaNetImpl*>(m))
      add({{"in_proj_qkv", &d->in_proj_qkv},
           {"in_proj_z", &d->in_proj_z},
           {"in_proj_b", &d->in_proj_b},
           {"in_proj_a", &d->in_proj_a},
           {"in_proj_qkvz", &d->in_proj_qkvz},
           {"in_proj_ba", &d->in_proj_ba},
           {"out_proj", &d->out_proj}});
  }
  return names;
}

fsdp::Float8GatherOptions float8_gather_options(const torch::nn::Module& model) {
  const std::vector<std::string> list = float8_weight_names(model);
  fsdp::Float8GatherOptions o;
  o.gathers = [names = std::set<std::string>(list.begin(), list.end())](const std::string& name) {
    return names.count(name) > 0;
  };
  o.cast = to_float8_with_amax;
  return o;
}

at::Tensor init_parameter(const DecoderConfig& c, uint64_t seed, const std::string& name, at::IntArrayRef shape) {
  return init_parameter_range(c, seed, name, shape, 0, c10::multiply_integers(shape)).view(shape);
}

at::Tensor init_parameter_range(const DecoderConfig& c, uint64_t seed, const std::string& name, at::IntArrayRef shape,
                                int64_t begin, int64_t count) {
  const int64_t n = c10::multiply_integers(shape);
  FSDP_CHECK(begin >= 0 && count >= 0 && begin + count <= n, "init_parameter_range: [", begin, ", ", begin + count,
             ") is outside ", name, "'s ", n, " values");
  if (is_lora_parameter(name)) return lora_init(seed, name, shape).reshape({-1}).narrow(0, begin, count).clone();
  // Gated DeltaNet's: the gated norm's weight (plain w), dt_bias ones, A_log the log of U(0.01, 16) as
  // transformers draws it.
  if (ends_with(name, "linear_attn.norm.weight") || ends_with(name, "linear_attn.dt_bias")) return at::ones({count});
  if (ends_with(name, "linear_attn.A_log")) {
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(named_stream(seed, name));
    return at::empty({n}).uniform_(0.01, 16.0, g).log_().narrow(0, begin, count).clone();
  }
  if (ends_with(name, ".layer_scalar")) return at::ones({count});             // Gemma 4's, as transformers makes it
  if (ends_with(name, ".e_score_correction_bias")) return at::zeros({count});   // GLM-4.5's router's, likewise
  if (ends_with(name, "layernorm.weight") || ends_with(name, "norm.weight") ||  // Gemma's (1 + w): zeros
      ends_with(name, "layernorm_1.weight") || ends_with(name, "layernorm_2.weight"))
    return c.norm_unit_offset ? at::zeros({count}) : at::ones({count});
  if (ends_with(name, "router.scale") || ends_with(name, "router.per_expert_scale")) return at::ones({count});
  // Biases start at zero, gpt-oss's experts' too; its router's bias and sinks are drawn, as transformers draws them.
  if ((ends_with(name, ".bias") && !ends_with(name, "router.bias")) || ends_with(name, "_proj_bias"))
    return at::zeros({count});
  return normal_range(named_stream(seed, name), c.initializer_range, n, begin, count);
}

void init_parameters(CausalLMImpl& model, uint64_t seed) {
  c10::NoGradGuard no_grad;
  for (const auto& p : model.named_parameters()) {
    at::Tensor v = init_parameter(model.config, seed, p.key(), p.value().sizes());
    if (p.value().storage().nbytes() == 0)
      p.value().set_data(v);
    else
      p.value().copy_(v);
  }
}

}  // namespace fsdp::model

// For hf_python_test.py, the Hugging Face golden test.
//   hf_tool export DIR MAX_SHARD_BYTES [tied]   (under fsdptrain launch, any world size) shards the
//       tiny Llama (configs/models/tiny, seed 11), exports it to DIR, and prints (rank 0) the logits
//       an unsharded copy of the same weights computes on kTokens, as JSON.
//   hf_tool logits DIR   loads DIR (config.json + safetensors) into fsdptrain's Llama and prints its
//       logits on kTokens as JSON; exit 2 listing the mismatches when DIR does not fit the model.
//   hf_tool golden DIR OUT [LENGTH [KERNELS]]   (one process) loads DIR of any family and prints, as JSON, its logits
//       on kTokens (or LENGTH > 0 tokens drawn from the vocabulary, the second record starting at 3/5 of them), the
//       summed loss of predicting each next token (the last predicts the first), every parameter's gradient of that
//       loss (a mixture of experts: its auxiliary loss and each expert's assignments on that forward), the parameter
//       count, FLOPs per token at T = the tokens and the layer class; the logits and loss of kTokens packed as two
//       records (data.packing: masked: positions restart at kPackedStart, each record sees only itself); then exports
//       the loaded model to OUT through the sharded engine. KERNELS (comma-separated: host, host+onednn-all, portable,
//       reference) runs it with each in turn, a line each naming them ("kernels"); without it, the environment's.
//   hf_tool count CONFIG_JSON...   prints the parameter count and layer class of each config.json, a line each.
//   hf_tool config CONFIG_JSON   prints the config.json an export of that model writes (every field as read,
//       transformers' defaults filled in for those the file leaves out).
//   hf_tool logits-of DIR TOKENS   loads DIR of any family and prints, as JSON, its logits on each
//       token list of TOKENS (a JSON list of lists), one flat list each.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "ckpt/hf.h"
#include "ckpt/sources.h"
#include "dist/process_group.h"
#include "model/kernels/provider.h"
#include "model/layers/decoder.h"
#include "util/error.h"
#include "util/strings.h"

namespace {

const std::vector<int64_t> kTokens = {3, 17, 42, 100, 256, 0, 5, 9, 77, 200};
constexpr int64_t kPackedStart = 4;  // the second record's first token

// `tokens` as two packed records, the second from `start`: logits, and the loss of each next token
// within its record.
nlohmann::json packed_json(fsdp::model::CausalLMImpl& m, const std::vector<int64_t>& tokens, int64_t start) {
  c10::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<int64_t> positions, segments, targets;
  for (int64_t i = 0; i < n; ++i) {
    const bool second = i >= start;
    positions.push_back(second ? i - start : i);
    segments.push_back(second ? 1 : 0);
    targets.push_back(i + 1 == start || i + 1 == n ? -100 : tokens[static_cast<size_t>(i) + 1]);
  }
  auto row = [n](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).view({1, n}); };
  const fsdp::model::Packed packed{row(positions), row(segments)};
  const at::Tensor x = row(tokens);
  const at::Tensor logits = m.logits_of(m.hidden_states(x, packed)).to(at::kDouble).reshape({-1}).contiguous();
  return {{"positions", positions},
          {"targets", targets},
          {"logits", std::vector<double>(logits.data_ptr<double>(), logits.data_ptr<double>() + logits.numel())},
          {"loss", m.loss_sum(x, row(targets), packed).item<double>()}};
}

nlohmann::json logits_json(fsdp::model::CausalLMImpl& m, const std::vector<int64_t>& tokens = kTokens) {
  c10::NoGradGuard no_grad;
  const at::Tensor x = at::tensor(tokens, at::kLong).view({1, -1});
  const at::Tensor logits = m.forward(x).to(at::kDouble).reshape({-1}).contiguous();
  return std::vector<double>(logits.data_ptr<double>(), logits.data_ptr<double>() + logits.numel());
}

// A parameter of `dir` (a fused tensor's part read as the parameter, as training reads it).
at::Tensor read_param(fsdp::ckpt::Source& src, const std::string& name, at::IntArrayRef shape) {
  return src.rows(name, 0, shape.empty() ? 1 : shape[0]).view(shape);
}

// Loads `dir` into an unsharded model (exit 2 for a config.json of no known family, or listing
// mismatched tensors).
fsdp::model::CausalLM load(const std::string& dir) {
  const fsdp::model::DecoderConfig c = fsdp::model::load_llama_config(dir + "/config.json");
  fsdp::ckpt::HfCheckpoint ck(dir);
  fsdp::model::CausalLM m(c);
  ck.check_matches(fsdp::model::describe(c));
  const auto src = fsdp::ckpt::open_hf_source(dir, fsdp::model::describe(c).layout);
  c10::NoGradGuard no_grad;
  for (const auto& p : m->named_parameters()) {
    const std::string name = src->info(p.key()) ? p.key() : "model.embed_tokens.weight";  // a tied head
    p.value().copy_(read_param(*src, name, p.value().sizes()));
  }
  return m;
}

// The kernels a golden run computes with, by the names families_python_test gives them: a provider
// (model/kernels/provider.h), or the host's with every product on oneDNN.
fsdp::model::kernels::KernelChoice kernels_named(const std::string& name) {
  namespace k = fsdp::model::kernels;
  if (name == "host+onednn-all") return {k::Provider::kHost, k::OnednnProducts::kAll};
  return {k::provider_named(name), k::OnednnProducts::kLarge};
}

// One golden run of `dir` with the kernels chosen now (a fresh model: no state of another run's).
nlohmann::json golden_json(const fsdp::model::DecoderConfig& c, const std::string& dir,
                           const std::vector<int64_t>& tokens, int64_t start) {
  fsdp::model::CausalLM m = load(dir);
  nlohmann::json j{{"tokens", tokens}, {"logits", logits_json(*m, tokens)}, {"packed", packed_json(*m, tokens, start)}};
  std::vector<int64_t> next(tokens.begin() + 1, tokens.end());
  next.push_back(tokens.front());
  const at::Tensor loss =
      m->loss_sum(at::tensor(tokens, at::kLong).view({1, -1}), at::tensor(next, at::kLong).view({1, -1}));
  loss.backward();
  j["loss"] = loss.item<double>();
  if (const at::Tensor aux = m->router_aux_loss(); aux.defined()) {  // the routing of the loss's forward
    // Gemma4ForCausalLM and Glm4MoeForCausalLM compute none to compare with.
    if (!c.moe.gemma4 && !c.moe.grouped_router) j["aux_loss"] = aux.item<double>();
    const at::Tensor load = m->expert_load();
    j["expert_load"] = std::vector<float>(load.data_ptr<float>(), load.data_ptr<float>() + load.numel());
  }
  std::map<std::string, at::Tensor> grads;
  for (const auto& p : m->named_parameters())  // a stored value that does not train (Gemma 4's layer_scalar) has none
    if (p.value().requires_grad()) grads[p.key()] = p.value().grad();
  for (const fsdp::model::FusedTensor& f : fsdp::model::describe(c).layout.fused) {  // under the folder's names
    std::vector<at::Tensor> parts;
    for (const auto& [name, rows] : f.parts) {
      parts.push_back(grads.at(name));
      grads.erase(name);
    }
    grads[f.name] = at::cat(parts, 0);
  }
  for (const auto& [name, grad] : grads) {
    const at::Tensor g = grad.to(at::kDouble).reshape({-1}).contiguous();
    j["grads"][name] = std::vector<double>(g.data_ptr<double>(), g.data_ptr<double>() + g.numel());
  }
  j["num_parameters"] = c.num_parameters();
  j["flops_per_token"] = c.flops_per_token(static_cast<int64_t>(tokens.size()));
  j["layer_class"] = fsdp::model::family_names(c.family).layer_class;
  return j;
}

// A golden line for each of `kernels` (comma-separated names; empty: the environment's choice), then
// the export of the loaded weights, which runs no kernel.
int golden(const std::string& dir, const std::string& out, int64_t length, const std::string& kernels) {
  const fsdp::model::DecoderConfig c = fsdp::model::load_llama_config(dir + "/config.json");
  std::vector<int64_t> tokens = kTokens;
  int64_t start = kPackedStart;
  if (length > 0) {  // spread over the vocabulary, none repeating the one before
    tokens.clear();
    for (int64_t i = 0; i < length; ++i) tokens.push_back((i * 37 + i * i * 11 + 3) % c.vocab_size);
    start = length * 3 / 5;
  }
  std::vector<nlohmann::json> lines;
  for (const std::string& name : fsdp::split(kernels, ',')) {  // "" (no KERNELS): the environment's choice
    if (!name.empty()) fsdp::model::kernels::set_kernel_choice(kernels_named(name));
    lines.push_back(golden_json(c, dir, tokens, start));
    if (!name.empty()) lines.back()["kernels"] = name;
  }
  // The export: the loaded weights sharded by the engine (one rank), written as a Hugging Face folder.
  fsdp::dist::ProcessGroup world = fsdp::dist::init_process_group({});
  fsdp::model::CausalLM lazy(c, /*free_after_create=*/true);
  fsdp::FsdpOptions o;
  const auto src = fsdp::ckpt::open_hf_source(dir, fsdp::model::describe(c).layout);
  o.init = [&src](const std::string& name, at::IntArrayRef shape) {
    return read_param(*src, src->info(name) ? name : "model.embed_tokens.weight", shape);
  };
  auto sharded = fsdp::fully_shard(*lazy, fsdp::model::decoder_traits(c), fsdp::DeviceMesh{world, std::nullopt}, o);
  fsdp::ckpt::export_hf(*sharded, fsdp::model::describe(c), out, {}, int64_t{5} << 30);
  for (const nlohmann::json& j : lines) std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 2 ? argv[1] : "";
    if (mode == "export" && argc >= 4) {
      fsdp::model::DecoderConfig c =
          fsdp::model::load_llama_config(std::string(FSDP_SOURCE_DIR) + "/configs/models/tiny/config.json");
      if (argc > 4 && std::string(argv[4]) == "tied") c.tie_word_embeddings = true;
      fsdp::dist::ProcessGroup world = fsdp::dist::init_process_group({});
      fsdp::model::CausalLM reference(c);
      fsdp::model::init_parameters(*reference, 11);
      fsdp::model::CausalLM lazy(c, /*free_after_create=*/true);
      fsdp::FsdpOptions o;
      o.init = [&c](const std::string& name, at::IntArrayRef shape) {
        return fsdp::model::init_parameter(c, 11, name, shape);
      };
      auto sharded = fsdp::fully_shard(*lazy, fsdp::model::decoder_traits(c), fsdp::DeviceMesh{world, std::nullopt}, o);
      fsdp::ckpt::export_hf(*sharded, fsdp::model::describe(c), argv[2], {}, std::stoll(argv[3]));
      if (world.rank() == 0)
        std::cout << nlohmann::json{{"tokens", kTokens}, {"logits", logits_json(*reference)}}.dump() << "\n";
      return 0;
    }
    if (mode == "logits") {
      fsdp::model::CausalLM m = load(argv[2]);
      std::cout << nlohmann::json{{"tokens", kTokens}, {"logits", logits_json(*m)}}.dump() << "\n";
      return 0;
    }
    if (mode == "golden" && argc >= 4)
      return golden(argv[2], argv[3], argc > 4 ? std::stoll(argv[4]) : 0, argc > 5 ? argv[5] : "");
    if (mode == "logits-of" && argc >= 4) {
      fsdp::model::CausalLM m = load(argv[2]);
      c10::NoGradGuard no_grad;
      nlohmann::json out = nlohmann::json::array();
      for (const auto& ids : nlohmann::json::parse(argv[3])) {
        const at::Tensor x = at::tensor(ids.get<std::vector<int64_t>>(), at::kLong).view({1, -1});
        const at::Tensor logits = m->forward(x).to(at::kDouble).reshape({-1}).contiguous();
        out.push_back(std::vector<double>(logits.data_ptr<double>(), logits.data_ptr<double>() + logits.numel()));
      }
      std::cout << out.dump() << "\n";
      return 0;
    }
    if (mode == "count") {  // each config.json's parameter count and layer class
      for (int i = 2; i < argc; ++i) {
        const fsdp::model::DecoderConfig c = fsdp::model::load_llama_config(argv[i]);
        std::cout << nlohmann::json{{"num_parameters", c.num_parameters()},
                                    {"layer_class", fsdp::model::family_names(c.family).layer_class}}
                         .dump()
                  << "\n";
      }
      return 0;
    }
    if (mode == "config") {
      std::cout << fsdp::model::decoder_config_json(fsdp::model::load_llama_config(argv[2])) << "\n";
      return 0;
    }
    std::cerr << "usage: hf_tool export DIR MAX_SHARD_BYTES [tied] | hf_tool logits DIR | hf_tool golden DIR OUT "
                 "[LENGTH [KERNELS]] | "
                 "hf_tool count CONFIG_JSON... | hf_tool config CONFIG_JSON | hf_tool logits-of DIR TOKENS\n";
    return 2;
  } catch (const fsdp::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return static_cast<int>(e.code());
  }
}

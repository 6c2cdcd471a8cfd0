// For hf_python_test.py, the Hugging Face golden test.
//   hf_tool export DIR MAX_SHARD_BYTES [tied]   (under fsdptrain launch, any world size) shards the
//       tiny Llama (configs/models/tiny, seed 11), exports it to DIR, and prints (rank 0) the logits
//       an unsharded copy of the same weights computes on kTokens, as JSON.
//   hf_tool logits DIR   loads DIR (config.json + safetensors) into fsdptrain's Llama and prints its
//       logits on kTokens as JSON; exit 2 listing the mismatches when DIR does not fit the model.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "ckpt/hf.h"
#include "dist/process_group.h"
#include "model/llama.h"
#include "util/error.h"

namespace {

const std::vector<int64_t> kTokens = {3, 17, 42, 100, 256, 0, 5, 9, 77, 200};

nlohmann::json logits_json(fsdp::model::LlamaForCausalLMImpl& m) {
  c10::NoGradGuard no_grad;
  const at::Tensor x = at::tensor(kTokens, at::kLong).view({1, -1});
  const at::Tensor logits = m.forward(x).to(at::kDouble).reshape({-1}).contiguous();
  return std::vector<double>(logits.data_ptr<double>(), logits.data_ptr<double>() + logits.numel());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 2 ? argv[1] : "";
    if (mode == "export" && argc >= 4) {
      fsdp::model::LlamaConfig c =
          fsdp::model::load_llama_config(std::string(FSDP_SOURCE_DIR) + "/configs/models/tiny/config.json");
      if (argc > 4 && std::string(argv[4]) == "tied") c.tie_word_embeddings = true;
      fsdp::dist::ProcessGroup world = fsdp::dist::init_process_group({});
      fsdp::model::LlamaForCausalLM reference(c);
      fsdp::model::init_parameters(*reference, 11);
      fsdp::model::LlamaForCausalLM lazy(c, /*free_after_create=*/true);
      fsdp::FsdpOptions o;
      o.init = [&c](const std::string& name, at::IntArrayRef shape) {
        return fsdp::model::init_parameter(c, 11, name, shape);
      };
      auto sharded = fsdp::fully_shard(*lazy, fsdp::model::llama_traits(c), fsdp::DeviceMesh{world, std::nullopt}, o);
      fsdp::ckpt::export_hf(*sharded, c, argv[2], std::stoll(argv[3]));
      if (world.rank() == 0)
        std::cout << nlohmann::json{{"tokens", kTokens}, {"logits", logits_json(*reference)}}.dump() << "\n";
      return 0;
    }
    if (mode == "logits") {
      fsdp::ckpt::HfCheckpoint ck(argv[2]);
      fsdp::model::LlamaForCausalLM m(ck.config());
      std::vector<std::pair<std::string, std::vector<int64_t>>> params;
      for (const auto& p : m->named_parameters()) params.emplace_back(p.key(), p.value().sizes().vec());
      ck.check_matches(params);
      c10::NoGradGuard no_grad;
      for (const auto& p : m->named_parameters()) p.value().copy_(ck.read(p.key()));
      std::cout << nlohmann::json{{"tokens", kTokens}, {"logits", logits_json(*m)}}.dump() << "\n";
      return 0;
    }
    std::cerr << "usage: hf_tool export DIR MAX_SHARD_BYTES [tied] | hf_tool logits DIR\n";
    return 2;
  } catch (const fsdp::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return static_cast<int>(e.code());
  }
}

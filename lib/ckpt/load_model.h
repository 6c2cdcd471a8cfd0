// One process loading a whole model to run it (fsdptrain generate): from a Hugging Face folder
// (config.json and safetensors), an fsdptrain checkpoint in either format (a step-N folder), or a
// checkpoint.dir holding step-N folders (the newest complete one). No launch, no process group.
#pragma once

#include <string>

#include "model/llama.h"

namespace fsdp::ckpt {

struct LoadedModel {
  model::LlamaForCausalLM model{nullptr};
  std::string folder;  // the folder the weights came from
  bool checkpoint = false;  // a training checkpoint (else a Hugging Face folder)
};

// Throws InputError naming the folder and what is missing or damaged: no config.json, no weights,
// a checkpoint that fails its manifest, tensors missing or of other shapes than config.json says.
LoadedModel load_model(const std::string& path);

}  // namespace fsdp::ckpt

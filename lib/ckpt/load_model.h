// One process loading a whole model to run it (fsdptrain generate): from a Hugging Face folder
// (config.json and safetensors), an fsdptrain checkpoint in either format (a step-N folder), or a
// checkpoint.dir holding step-N folders (the newest complete one). No launch, no process group.
// The caller builds the model from the folder's config.json (model/), then fills it here.
#pragma once

#include <string>

#include "model/config/description.h"

namespace torch::nn {
class Module;
}

namespace fsdp::ckpt {

struct ModelFolder {
  std::string folder;       // the folder the weights and config.json are in
  bool checkpoint = false;  // a training checkpoint (else a Hugging Face folder)
};

// Throws InputError naming `path` when it is no folder, or holds neither config.json nor a
// checkpoint. A checkpoint's files are verified against its manifest (every file there, every
// size and checksum right).
ModelFolder find_model_folder(const std::string& path);

// Copies every parameter of `module` (named and shaped as `description` lists them; a tied head
// from whichever name it was stored under) from the folder. Throws InputError, before any weight
// changes, listing every tensor missing, unexpected or of another shape than config.json says.
void load_weights(torch::nn::Module& module, const ModelFolder& folder, const model::ModelDescription& description);

}  // namespace fsdp::ckpt

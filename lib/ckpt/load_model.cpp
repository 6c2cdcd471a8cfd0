#include "ckpt/load_model.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <map>

#include "ckpt/format.h"
#include "ckpt/hf.h"
#include "ckpt/peft.h"
#include "ckpt/sources.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hub_cache.h"
#include "util/strings.h"

namespace fsdp::ckpt {

ModelFolder find_model_folder(const std::string& given) {
  const std::string path = hub::model_folder(given);  // a Hub id: its snapshot in the Hugging Face cache
  FSDP_CHECK(is_directory(path) || !hub::is_repo_id(path) || file_exists(path), "[generate] --model ", quoted(path),
             " is no folder here, and ", hub::not_cached(hub::RepoType::kModel, path, "main"));
  FSDP_CHECK(is_directory(path), "[generate] --model ", quoted(path), " is ",
             file_problem(path).empty() ? "a file" : file_problem(path),
             "; give a Hugging Face folder or an fsdptrain checkpoint (a step-N folder or the checkpoint.dir)");
  ModelFolder out;
  out.folder = path;
  if (!file_exists(path_in(path, kManifest)) && !file_exists(path + "/config.json")) {
    out.folder = latest_checkpoint(path);
    FSDP_CHECK(!out.folder.empty(), "[generate] ", path,
               " has no config.json: it is neither a Hugging Face folder "
               "nor a checkpoint (manifest.json) nor a folder holding step-N checkpoints");
  }
  out.checkpoint = file_exists(path_in(out.folder, kManifest));
  if (out.checkpoint) verify_checkpoint(out.folder);
  return out;
}

void load_weights(torch::nn::Module& module, const ModelFolder& f, const model::ModelDescription& description) {
  std::unique_ptr<Source> src = f.checkpoint ? open_source(f.folder) : open_hf_source(f.folder, description.layout);
  // Every parameter is in `src` with its shape; a checkpoint's optimizer state is not a parameter.
  const std::vector<std::string> names = src->names();
  refuse_adapters_only(names, f.folder, "[generate]",
                       "Give the run's export (a PEFT folder: --model EXPORT_DIR), or resume the run to write one");
  std::map<std::string, std::vector<int64_t>> stored;
  for (const std::string& name : names) stored[name] = src->info(name)->shape;
  std::vector<ExpectedTensor> expected;
  for (const model::ParamSpec& p : description.params) expected.push_back({p.name, p.shape, p.aliases});
  check_tensors_match(f.folder, stored, expected,
                      "check that " + f.folder + "/config.json is the one it was saved with", "optim.");
  std::map<std::string, const model::ParamSpec*> specs;
  for (const model::ParamSpec& p : description.params) specs[p.name] = &p;
  c10::NoGradGuard no_grad;
  for (const auto& p : module.named_parameters()) {
    auto it = specs.find(p.key());
    FSDP_ASSERT(it != specs.end(), "load_weights: the description has no parameter ", p.key());
    std::string name = p.key();
    for (size_t i = 0; !src->info(name) && i < it->second->aliases.size(); ++i) name = it->second->aliases[i];
    const int64_t rows = p.value().dim() == 0 ? 1 : p.value().size(0);
    p.value().copy_(src->rows(name, 0, rows).view(p.value().sizes()));
  }
}

}  // namespace fsdp::ckpt

#include "ckpt/load_model.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "ckpt/format.h"
#include "ckpt/sources.h"
#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

// Every parameter of `m` is in `src` with its shape; else one error listing each that is not.
void check_tensors(model::LlamaForCausalLMImpl& m, const Source& src, const std::string& folder) {
  std::string problems;
  for (const auto& p : m.named_parameters()) {
    const StoredInfo* info = src.info(p.key());
    if (!info)
      problems += str("\n  missing: ", p.key());
    else if (info->shape != p.value().sizes().vec())
      problems += str("\n  ", p.key(), ": stored ", shape_text(info->shape), ", the model needs ",
                      shape_text(p.value().sizes().vec()));
  }
  FSDP_CHECK(problems.empty(), "[generate] ", folder, " does not match the model its config.json describes:",
             problems);
}

}  // namespace

LoadedModel load_model(const std::string& path) {
  FSDP_CHECK(is_directory(path), "[generate] --model ", quoted(path), " is ", file_problem(path).empty() ? "a file" : file_problem(path),
             "; give a Hugging Face folder or an fsdptrain checkpoint (a step-N folder or the checkpoint.dir)");
  LoadedModel out;
  out.folder = path;
  if (!file_exists(path_in(path, kManifest)) && !file_exists(path + "/config.json")) {
    out.folder = latest_checkpoint(path);
    FSDP_CHECK(!out.folder.empty(), "[generate] ", path, " has no config.json: it is neither a Hugging Face folder "
               "nor a checkpoint (manifest.json) nor a folder holding step-N checkpoints");
  }
  out.checkpoint = file_exists(path_in(out.folder, kManifest));
  if (out.checkpoint) verify_checkpoint(out.folder);  // every file there, every size right
  const model::LlamaConfig config = model::load_llama_config(out.folder + "/config.json");
  std::unique_ptr<Source> src = out.checkpoint ? open_source(out.folder) : open_hf_source(out.folder);
  out.model = model::LlamaForCausalLM(config);
  check_tensors(*out.model, *src, out.folder);
  c10::NoGradGuard no_grad;
  for (const auto& p : out.model->named_parameters()) {
    const int64_t rows = p.value().dim() == 0 ? 1 : p.value().size(0);
    p.value().copy_(src->rows(p.key(), 0, rows).view(p.value().sizes()));
  }
  return out;
}

}  // namespace fsdp::ckpt

#include "ckpt/load_model.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "ckpt/format.h"
#include "ckpt/hf.h"
#include "ckpt/sources.h"
#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

// Every parameter of `m` is in `src` with its shape (ckpt::check_tensors_match lists what is not);
// a checkpoint's optimizer state is not a parameter.
void check_tensors(model::LlamaForCausalLMImpl& m, const Source& src, const std::string& folder) {
  std::map<std::string, std::vector<int64_t>> stored;
  for (const std::string& name : src.names()) stored[name] = src.info(name)->shape;
  std::vector<ExpectedTensor> expected;
  for (const auto& p : m.named_parameters()) {
    expected.push_back({p.key(), p.value().sizes().vec(), {}});
    if (m.config.tie_word_embeddings && p.key() == "model.embed_tokens.weight")  // a folder may name both
      expected.back().aliases.push_back("lm_head.weight");
  }
  check_tensors_match(folder, stored, expected, "check that " + folder + "/config.json is the one it was saved with",
                      "optim.");
}

}  // namespace

LoadedModel load_model(const std::string& path) {
  FSDP_CHECK(is_directory(path), "[generate] --model ", quoted(path), " is ",
             file_problem(path).empty() ? "a file" : file_problem(path),
             "; give a Hugging Face folder or an fsdptrain checkpoint (a step-N folder or the checkpoint.dir)");
  LoadedModel out;
  out.folder = path;
  if (!file_exists(path_in(path, kManifest)) && !file_exists(path + "/config.json")) {
    out.folder = latest_checkpoint(path);
    FSDP_CHECK(!out.folder.empty(), "[generate] ", path,
               " has no config.json: it is neither a Hugging Face folder "
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
    const std::string name = src->info(p.key()) ? p.key() : "lm_head.weight";  // a tied head stored once
    p.value().copy_(src->rows(name, 0, rows).view(p.value().sizes()));
  }
  return out;
}

}  // namespace fsdp::ckpt

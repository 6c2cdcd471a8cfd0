#include "ckpt/pretrained.h"

#include "ckpt/sources.h"
#include "model/lora/lora.h"

namespace fsdp::ckpt {

void load_pretrained(ShardedModel& model, const std::string& dir, dist::ProcessGroup& world, bool efficient,
                     const model::FolderLayout& layout) {
  std::unique_ptr<Source> src = open_hf_source(dir, layout);
  // Adapters (LoRA) are not the base's: they start from lora.init or their own initialisation.
  const std::vector<Slot> slots =
      slots_of(model, [](const ShardedParam& p) { return !model::is_lora_parameter(p.name); });
  check_matches_model(*src, slots, /*optimizer=*/false, dir,
                      "check that model.config describes the same architecture as " + dir + "/config.json");
  fill(slots, model, nullptr, src.get(), world, efficient);
}

}  // namespace fsdp::ckpt

#include "ckpt/pretrained.h"

#include "ckpt/sources.h"

namespace fsdp::ckpt {

void load_pretrained(ShardedModel& model, const std::string& dir, dist::ProcessGroup& world, bool efficient) {
  std::unique_ptr<Source> src = open_hf_source(dir);
  check_matches_model(*src, slots_of(model), /*optimizer=*/false, dir,
                      "check that model.config describes the same architecture as " + dir + "/config.json");
  fill(model, nullptr, src.get(), world, efficient);
}

}  // namespace fsdp::ckpt

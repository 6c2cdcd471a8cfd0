#include "config/resolved.h"

#include "util/error.h"

namespace fsdp::config {

const ResolvedValue& ResolvedConfig::get(const std::string& key) const {
  for (const auto& v : values)
    if (v.spec->key == key) return v;
  FSDP_ASSERT(false, "no option ", key);
  return values.front();
}

bool ResolvedConfig::is_set(const std::string& key) const {
  auto k = get(key).origin.kind;
  return k == OriginKind::kFile || k == OriginKind::kSet || k == OriginKind::kFlag || k == OriginKind::kScheduler;
}

}  // namespace fsdp::config

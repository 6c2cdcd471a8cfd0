#include "fsdp/float8_gather.h"

#include <mutex>
#include <unordered_map>

namespace fsdp {

namespace {

// Keyed by the parameter's TensorImpl: the module's leaf stays the same object from fully_shard on
// (its bytes come and go, the tensor does not).
struct Registry {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, GatheredFloat8> values;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::optional<GatheredFloat8> gathered_float8(const at::Tensor& parameter) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.values.find(parameter.unsafeGetTensorImpl());
  if (it == r.values.end()) return std::nullopt;
  return it->second;
}

size_t gathered_float8_count() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return r.values.size();
}

void hold_gathered_float8(const at::Tensor& parameter, GatheredFloat8 value) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.values[parameter.unsafeGetTensorImpl()] = std::move(value);
}

void drop_gathered_float8(const at::Tensor& parameter) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.values.erase(parameter.unsafeGetTensorImpl());
}

}  // namespace fsdp

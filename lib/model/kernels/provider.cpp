#include "model/kernels/provider.h"

#include <algorithm>
#include <atomic>

#include "model/kernels/elementwise.h"
#include "util/env.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::model::kernels {

namespace {

// -1: not set by set_kernel_choice (the environment decides).
std::atomic<int> g_provider{-1}, g_onednn{-1};

template <size_t N>
int index_named(const std::string& value, const std::array<const char*, N>& names, const std::string& what) {
  const auto it = std::find(names.begin(), names.end(), value);
  FSDP_CHECK(it != names.end(), what, "=", quoted(value), ": expected one of ",
             join(std::vector<std::string>(names.begin(), names.end()), ", "));
  return static_cast<int>(it - names.begin());
}

}  // namespace

void set_kernel_choice(KernelChoice choice) {
  g_onednn = static_cast<int>(choice.onednn);
  g_provider = static_cast<int>(choice.provider);
}

KernelChoice kernel_choice() {
  const int p = g_provider.load(std::memory_order_relaxed), o = g_onednn.load(std::memory_order_relaxed);
  if (p >= 0 && o >= 0) return {static_cast<Provider>(p), static_cast<OnednnProducts>(o)};
  static const KernelChoice environment = {
      static_cast<Provider>(env_choice(env::kKernels, kProviderNames)),
      static_cast<OnednnProducts>(env_choice(env::kOnednnProducts, kOnednnProductsNames))};
  return environment;
}

Provider provider_for(const at::Tensor& x) {
  const Provider p = kernel_choice().provider;
  const c10::Device device = x.device();
  switch (p) {
    case Provider::kAuto:
      if (device.is_cpu()) return Provider::kHost;
      return available_on(device) ? Provider::kPortable : Provider::kReference;
    case Provider::kHost:
      FSDP_CHECK(device.is_cpu(), "[model] engine.kernels: host is the CPU's kernels, and this run's tensors are on ",
                 device.str(), "; use auto (portable there) or reference");
      return p;
    case Provider::kPortable:
      FSDP_CHECK(available_on(device), "[model] engine.kernels: portable has no kernels for ", device.str(),
                 " in this build (built without nvcc); use engine.kernels: reference");
      return p;
    case Provider::kReference:
      return p;
  }
  return p;
}

const char* provider_name(Provider p) {
  return kProviderNames[static_cast<size_t>(p)];
}

Provider provider_named(const std::string& name) {
  return static_cast<Provider>(index_named(name, kProviderNames, "engine.kernels"));
}

OnednnProducts onednn_products_named(const std::string& name) {
  return static_cast<OnednnProducts>(index_named(name, kOnednnProductsNames, "engine.onednn_products"));
}

}  // namespace fsdp::model::kernels

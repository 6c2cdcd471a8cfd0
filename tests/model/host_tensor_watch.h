// HostTensorWatch: names every op that reads a host tensor while it lives, for the meta-device
// tests (a GPU step must never meet one). Shared by the model tests.
#pragma once

#include <ATen/record_function.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>

namespace fsdp::model::testing {

// Names every op that gets a host tensor of one or more dimensions while armed (0-dim host tensors
// are scalars, which every device takes by value).
class HostTensorWatch {
 public:
  HostTensorWatch() {
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&HostTensorWatch::on_op).needsInputs(true));
    armed() = true;
  }
  ~HostTensorWatch() {
    armed() = false;
    at::removeCallback(handle_);
  }
  static std::set<std::string> take() {
    std::lock_guard<std::mutex> lock(mu());
    std::set<std::string> out;
    out.swap(found());
    return out;
  }

 private:
  static bool host(const c10::IValue& v) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      return t.defined() && t.device().is_cpu() && t.dim() > 0;
    }
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorVector())
        if (t.defined() && t.device().is_cpu() && t.dim() > 0) return true;
    return false;
  }
  static std::unique_ptr<at::ObserverContext> on_op(const at::RecordFunction& fn) {
    if (!armed()) return nullptr;
    for (const c10::IValue& v : fn.inputs())
      if (host(v)) {
        std::lock_guard<std::mutex> lock(mu());
        found().insert(fn.name());
        break;
      }
    return nullptr;
  }
  static std::atomic<bool>& armed() {
    static std::atomic<bool> a{false};
    return a;
  }
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::set<std::string>& found() {
    static std::set<std::string> f;
    return f;
  }
  at::CallbackHandle handle_;
};

inline std::string joined(const std::set<std::string>& s) {
  std::string out;
  for (const std::string& x : s) out += (out.empty() ? "" : ", ") + x;
  return out;
}

}  // namespace fsdp::model::testing

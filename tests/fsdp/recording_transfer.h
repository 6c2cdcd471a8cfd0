// RecordingTransfer: a HostTransfer (fsdp/host_transfer.h) for CPU tests, so that the offloaded
// path a GPU takes (uploads, their tickets, downloads, the waits) runs and is checked here. There
// are no streams: each copy runs at once. Every call is logged, and each upload's ticket must be
// waited for exactly once.
#pragma once

#include <ATen/ATen.h>

#include <set>
#include <string>
#include <vector>

#include "fsdp/host_transfer.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::testing {

class RecordingTransfer final : public HostTransfer {
 public:
  // "upload N", "wait N", "download", "synchronize downloads", "synchronize", and what the test
  // adds itself ("compute").
  std::vector<std::string> log;

  uint64_t upload(const std::function<void()>& copies) override {
    copies();
    outstanding_.insert(++last_);
    log.push_back(str("upload ", last_));
    return last_;
  }
  void wait(uint64_t ticket) override {
    FSDP_ASSERT(outstanding_.erase(ticket) == 1, "upload ", ticket, " waited for twice or never issued");
    log.push_back(str("wait ", ticket));
  }
  void download(const at::Tensor& host, const at::Tensor& device) override {
    host.copy_(device);
    log.push_back("download");
  }
  void synchronize_downloads() override { log.push_back("synchronize downloads"); }
  void synchronize() override { log.push_back("synchronize"); }

  // Uploads issued and not yet waited for.
  size_t outstanding() const { return outstanding_.size(); }

 private:
  std::set<uint64_t> outstanding_;
  uint64_t last_ = 0;
};

}  // namespace fsdp::testing

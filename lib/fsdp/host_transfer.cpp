#include "fsdp/host_transfer.h"

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <map>
#include <utility>

#include "util/error.h"

namespace fsdp {

namespace {

class StreamTransfer final : public HostTransfer {
 public:
  explicit StreamTransfer(c10::Device device)
      : device_(device),
        guard_(device.type()),
        upload_(guard_.getStreamFromGlobalPool(device)),
        download_(guard_.getStreamFromGlobalPool(device)) {}

  uint64_t upload(const std::function<void()>& copies) override {
    after_current(upload_);
    {
      c10::StreamGuard on(upload_);
      copies();
    }
    c10::Event done(device_.type());
    done.record(upload_);
    const uint64_t ticket = ++last_;
    pending_.emplace(ticket, std::move(done));
    return ticket;
  }

  void wait(uint64_t ticket) override {
    auto it = pending_.find(ticket);
    FSDP_ASSERT(it != pending_.end(), "HostTransfer: upload ", ticket, " waited for twice or never issued");
    it->second.block(current());
    pending_.erase(it);
  }

  void download(const at::Tensor& host, const at::Tensor& device) override {
    after_current(download_);
    c10::StreamGuard on(download_);
    host.copy_(device, /*non_blocking=*/true);
    // The device block was allocated on the current stream, which may reuse it as soon as it is
    // dropped there: the allocator keeps it until the download stream's copy is done.
    guard_.recordDataPtrOnStream(device.storage().data_ptr(), download_);
  }

  void synchronize_downloads() override { download_.synchronize(); }

  void synchronize() override {
    upload_.synchronize();
    download_.synchronize();
  }

 private:
  c10::Stream current() const { return guard_.getStream(device_); }

  // `stream` waits for the work queued on the current stream so far (the memory it writes or reads
  // may have been freed and reallocated there, with kernels still reading or writing it).
  void after_current(const c10::Stream& stream) const {
    c10::Event queued(device_.type());
    queued.record(current());
    queued.block(stream);
  }

  c10::Device device_;
  c10::impl::VirtualGuardImpl guard_;
  c10::Stream upload_, download_;
  std::map<uint64_t, c10::Event> pending_;
  uint64_t last_ = 0;
};

}  // namespace

std::shared_ptr<HostTransfer> make_stream_transfer(c10::Device device) {
  FSDP_ASSERT(!device.is_cpu(), "make_stream_transfer: the CPU has no streams to copy on");
  return std::make_shared<StreamTransfer>(device);
}

}  // namespace fsdp

// HostTransfer: the copies between host memory and the device that CPU offload needs, on their own
// streams, so that they overlap the units' compute instead of queueing in front of it (FSDP2 runs
// its offloaded copy-in on the all-gather copy-in stream and its gradients' copy-out on the
// reduce-scatter stream for the same reason).
//
//   upload(copies)  the current stream's work so far, then `copies` (host-to-device copies into
//                   memory allocated on the current stream) on the upload stream; returns a ticket.
//                   A unit's prefetch uploads it while the unit before it computes.
//   wait(ticket)    the current stream waits for that upload (no host wait). Every ticket is waited
//                   for exactly once, before its memory is read or freed on the current stream, so
//                   the caching allocator never hands that block to later work too early.
//   download(h, d)  the current stream's work so far, then the copy of device tensor d into pinned
//                   host tensor h on the download stream; d's block is kept from reuse until then.
//   synchronize_downloads(), synchronize()  host waits: for the downloads, or for both streams.
//
// make_stream_transfer(device) gives the device's streams (c10's device-generic streams and events:
// this file needs no CUDA header); tests give a recording implementation on the CPU, where the
// copies run at once, to check the order of the calls (tests/fsdp/host_transfer_test.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace fsdp {

class HostTransfer {
 public:
  virtual ~HostTransfer() = default;
  virtual uint64_t upload(const std::function<void()>& copies) = 0;
  virtual void wait(uint64_t ticket) = 0;
  virtual void download(const at::Tensor& host, const at::Tensor& device) = 0;
  virtual void synchronize_downloads() = 0;
  virtual void synchronize() = 0;
};

// One upload stream and one download stream of `device` (not the CPU), from its stream pool.
std::shared_ptr<HostTransfer> make_stream_transfer(c10::Device device);

}  // namespace fsdp

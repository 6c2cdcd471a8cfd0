// Backend: the collectives FSDP needs, implemented once per transport (gloo/, nccl/, local).
// The engine never calls a Backend directly; it goes through ProcessGroup (process_group.h),
// which adds timeouts, messages and byte counting.
//
// Contract for every collective: all ranks of the group call it, in the same order, with tensors
// of the same dtype and matching sizes (checked by ProcessGroup before the call), on the backend's
// device type (device_type(); checked by ProcessGroup too). Tensors must be contiguous. The call may
// return before the data has moved; PendingWork::wait makes the result visible to the caller's
// device stream, and the backend keeps the tensors alive until then. `label` says what the caller
// does with the collective ("gather model.layers.3"), for the backend's error messages.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::dist {

enum class ReduceOp { kSum, kAvg, kMax };  // kMax: all_reduce only

// One issued collective. wait() returns true when the result is ready, false when `timeout`
// passed first (the caller turns that into an error naming the collective); it throws when the
// transport failed (a peer died, a connection dropped).
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  virtual bool wait(std::chrono::milliseconds timeout) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "gloo", "nccl", "local"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The device type every tensor handed to this backend must be on; none: any (the local backend).
  virtual std::optional<c10::DeviceType> device_type() const = 0;

  // out (size*n) = concat over ranks of in (n). in may be a view into out (in-place gather).
  virtual std::unique_ptr<PendingWork> all_gather(at::Tensor out, at::Tensor in, const std::string& label) = 0;
  // out (n) = op over ranks of in[rank*n : (rank+1)*n], in (size*n). in is scratch: its contents
  // are unspecified once the work is done (Gloo reduces in it).
  virtual std::unique_ptr<PendingWork> reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op,
                                                      const std::string& label) = 0;
  virtual std::unique_ptr<PendingWork> all_reduce(at::Tensor tensor, ReduceOp op, const std::string& label) = 0;
  virtual std::unique_ptr<PendingWork> broadcast(at::Tensor tensor, int root, const std::string& label) = 0;
  virtual std::unique_ptr<PendingWork> barrier(const std::string& label) = 0;
  // out and in flat; out_splits[r] elements of out come from rank r, in_splits[r] of in go to rank r
  // (c10d's all_to_all_single). Every rank's in_splits[j] equals rank j's out_splits[this rank].
  virtual std::unique_ptr<PendingWork> all_to_all(at::Tensor out, at::Tensor in, std::vector<int64_t> out_splits,
                                                  std::vector<int64_t> in_splits, const std::string& label) = 0;
};

// Work that is already complete (the local backend, and zero-sized collectives).
class DoneWork : public PendingWork {
 public:
  bool wait(std::chrono::milliseconds) override { return true; }
};

}  // namespace fsdp::dist

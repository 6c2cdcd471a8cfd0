// ProcessGroup: the handle the FSDP engine and the launcher's health check call for collectives.
//
// A small value type over a shared Backend. It checks every call's tensors (dtype, sizes,
// contiguity, and the device the backend moves: a host tensor never reaches NCCL) before issuing
// it, counts the bytes each rank sends, and gives back a Work whose wait() fails with a message
// naming the collective, what it was for (its label), the rank and how long it waited. With
// `debug` (the config's debug: true, or FSDPTRAIN_DEBUG=1) every collective first checks across
// the ranks, over a Gloo group of its own, that they all issue the same operation with the same
// dtype and sizes, and names the first rank and collective that differ instead of hanging (c10d's
// ProcessGroupWrapper under TORCH_DISTRIBUTED_DEBUG=DETAIL does the same).
//
// Collective: every method except the accessors must be called by all ranks of the group in the
// same order. Thread safety: one thread at a time issues collectives and waits on their Work. On
// CUDA that is the training thread in forward and the autograd engine's device thread in backward
// (the engine's hooks run there, one at a time, while the training thread waits in backward()):
// both issue on the current device, and a Work's wait() orders the *calling* thread's current
// stream after the collective.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/backend.h"
#include "dist/worker_context.h"

namespace fsdp::dist {

enum class Collective { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier, kAllToAll, kShift };
inline constexpr std::array<const char*, 7> kCollectiveNames = {
    "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "all_to_all", "shift"};

// Bytes each rank sends, per collective, as the ring algorithms that nccl-tests' bus bandwidth
// assumes (S = the larger of the two buffers, W = group size, all 0 when W = 1):
//   all_gather (W-1)/W * S    reduce_scatter (W-1)/W * S    all_reduce 2(W-1)/W * S
//   broadcast S               barrier 0
//   all_to_all (W-1)/W * S    shift S (all of it to one neighbour)
// Bus bandwidth is then bytes_sent / time. Counts are exact integers: S*(W-1)/W is whole
// because S is W equal chunks.
struct ByteCounters {
  std::array<int64_t, 7> bytes{};  // by Collective
  std::array<int64_t, 7> calls{};
  int64_t total() const;
  int64_t of(Collective c) const { return bytes[static_cast<size_t>(c)]; }
  int64_t calls_of(Collective c) const { return calls[static_cast<size_t>(c)]; }
};

// Bytes one rank sends for one collective on S bytes in a group of W (the table above).
int64_t bytes_sent(Collective c, int64_t s, int world_size);

class Work {
 public:
  Work() = default;  // already done
  Work(std::unique_ptr<PendingWork> pending, Collective c, std::string label, int rank, int size,
       std::chrono::milliseconds timeout, int64_t bytes);
  // Makes the result usable, or throws fsdp::Error "[dist] all_gather (gather model.layers.3) of
  // 4.0 MB on rank 1 of 4 did not finish within 30 s ..." on timeout, or the transport's failure
  // with the same context. What "usable" means depends on the backend:
  //   Gloo (CPU), single process: the host blocks until the output is written.
  //   NCCL: a collective's wait() does not block the host; it makes the caller's current CUDA
  //         stream wait for the collective, so later work queued on that stream sees the output,
  //         and the backend lets go of the collective's tensors. barrier() blocks the host. A
  //         collective that never finishes is caught by c10d's watchdog, which aborts the
  //         communicator; the next call throws.
  void wait();
  bool done() const { return pending_ == nullptr; }

 private:
  std::shared_ptr<PendingWork> pending_;
  Collective collective_ = Collective::kBarrier;
  std::string label_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_{0};
  int64_t bytes_ = 0;
};

class Store;

class ProcessGroup {
 public:
  // store: the rendezvous this group met at, kept so that new_group() can build subgroups; null
  // for the single-process group. gpu: the GPU an NCCL backend runs on (its subgroups use it too).
  ProcessGroup(std::shared_ptr<Backend> backend, std::chrono::milliseconds timeout,
               std::shared_ptr<Store> store = nullptr, int gpu = -1);

  int rank() const { return backend_->rank(); }
  int size() const { return backend_->size(); }
  std::string backend_name() const { return backend_->name(); }
  // The single-process group: collectives are local copies (no transport, no stream).
  bool is_local() const { return backend_->name() == "local"; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // `label` says what the collective is for ("gather model.layers.3"); errors name it.
  // out: (size * n), in: (n), same dtype and device, both contiguous.
  Work all_gather(const at::Tensor& out, const at::Tensor& in, const std::string& label = "");
  // out: (n), in: (size * n). kAvg divides by size() (in the reduction dtype of the tensor). in is
  // scratch: what it holds afterwards is unspecified.
  Work reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op = ReduceOp::kSum,
                      const std::string& label = "");
  Work all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum, const std::string& label = "");
  Work broadcast(const at::Tensor& tensor, int root, const std::string& label = "");
  Work barrier(const std::string& label = "");
  // out, in: (size * n), same dtype and device, contiguous: out's block r (n elements) is rank r's
  // block `rank()` of in (c10d's all_to_all_single with equal splits; Ulysses' head/sequence swap).
  Work all_to_all(const at::Tensor& out, const at::Tensor& in, const std::string& label = "");
  // Unequal splits along dim 0 (c10d's all_to_all_single with split sizes; expert parallel's token
  // exchange): in_rows[r] rows of `in` go to rank r, in order, and out receives out_rows[r] rows from
  // rank r, rank-major. out and in contiguous, of the same dtype and row size; every rank's
  // in_rows[j] must equal rank j's out_rows[rank()]. Bytes counted: the rows sent to other ranks.
  Work all_to_all(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_rows,
                  const std::vector<int64_t>& in_rows, const std::string& label = "");
  // The ring step: this rank's in goes to rank (rank + offset) mod size, and out receives rank
  // (rank - offset) mod size's; out and in the same shape, distinct. Context parallel's K/V ring.
  Work shift(const at::Tensor& out, const at::Tensor& in, int offset = 1, const std::string& label = "");
  // Every rank's `mine` (n elements, the same n on every rank) concatenated rank-major: (W * n), on
  // mine's device, waited for. The gather itself runs where the backend moves data (this rank's GPU
  // for NCCL), so host tensors (offloaded shards, checkpoint slices) may be gathered over any backend.
  at::Tensor all_gather_copies(const at::Tensor& mine, const std::string& label = "");

  // Turns on the cross-rank check of every collective (see above). Collective: every rank of the
  // group calls it; the group needs a store (a no-op for the single-process group). Subgroups made
  // afterwards check themselves too.
  void enable_debug_checks();
  bool debug_checks() const { return check_ != nullptr; }

  // A group of some ranks of this one (ranks: their ranks here, ascending; this rank among them),
  // on the same transport; this rank's rank there is its index in `ranks`. Collective over the
  // members only: every member calls it with the same list, and every rank of this group makes
  // its k-th new_group call for the same subgroup as the other members' k-th (so one mesh built
  // twice gets fresh groups). Used for HSDP's shard and replicate groups. A list of one gives the
  // single-process group; a list of all of this group's ranks gives this group, unless `own` (a
  // transport and counters of its own: context parallel's group beside FSDP's over the same ranks).
  ProcessGroup new_group(const std::vector<int>& ranks, bool own = false) const;
  // The same over Gloo, always a new group (also for every rank, also when this one is NCCL): for
  // host-memory collectives run by another thread (the checkpoint writer) without interleaving
  // with this group's.
  ProcessGroup new_host_group(const std::vector<int>& ranks) const;

  // The rendezvous store this group met at (null for the single-process group). One thread at a
  // time: another thread opens its own connection from the store's options.
  const std::shared_ptr<Store>& store() const { return store_; }

  // Totals since construction or the last reset, for this rank.
  const ByteCounters& counters() const { return *counters_; }
  void reset_counters() { *counters_ = ByteCounters{}; }

 private:
  // Checks the tensors, runs the cross-rank check, issues, counts.
  // sent: the bytes this rank sends when not the table's for s (unequal all-to-all splits).
  template <typename Issue>
  Work issue(Collective c, const std::string& label,
             std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors, int64_t s, int64_t detail,
             Issue fn, std::optional<int64_t> sent = std::nullopt);
  void check_across_ranks(Collective c, const std::string& label, const at::Tensor* out, const at::Tensor* in,
                          int64_t detail);
  ProcessGroup make_group(const std::vector<int>& ranks, bool host, bool own = false) const;
  std::shared_ptr<Backend> backend_;
  std::shared_ptr<Backend> check_;  // debug: a Gloo group of the same ranks for the cross-rank check
  std::chrono::milliseconds timeout_;
  std::shared_ptr<ByteCounters> counters_;
  std::shared_ptr<Store> store_;
  int gpu_ = -1;
  std::shared_ptr<int> subgroups_made_ = std::make_shared<int>(0);
};

// A group of one (rank 0 of 1): every collective is a local copy and sends nothing.
ProcessGroup make_single_process_group();

// The process group of this worker: `context` says its rank, world size and GPU (the launcher's
// variables, read once by worker_context()); MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE
// and TORCHELASTIC_RESTART_COUNT say where the rendezvous is. A world size of 1 gives the
// single-process group, except on a GPU, where it is an NCCL group of one (as torchrun with one
// process and init_process_group("nccl") gives), so one GPU runs the same path as many.
// backend: "gloo", "nccl" or "auto" (the context's). Collective: every rank calls it. Throws
// naming the missing variable or the unreachable rendezvous.
struct GroupOptions {
  std::string backend = "auto";
  // The cross-rank check of every collective; unset: on when FSDPTRAIN_DEBUG=1 or ACCELERATE_DEBUG_MODE
  // (the config's debug key, which the launcher exports) is true.
  std::optional<bool> debug;
  // Per-collective timeout; unset: $FSDPTRAIN_DIST_TIMEOUT seconds (the launcher exports the
  // dist_timeout key there), else 600 s.
  std::optional<std::chrono::milliseconds> timeout;
  // Unset: worker_context(use_cpu = backend is "gloo").
  std::optional<WorkerContext> context;
};
ProcessGroup init_process_group(const GroupOptions& options);

}  // namespace fsdp::dist

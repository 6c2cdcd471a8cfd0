#include "dist/nccl/nccl_backend.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "dist/store_impl.h"
#include "dist/torch_compat.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::dist {

namespace {

// c10d reads its switches from the environment when a group is built (once per process: before the
// first group, while no c10d thread runs). Ours, unless the user set them:
//   - clean up and let the next call throw on a failure, instead of killing the process;
//   - no debug dump on a timeout, and a short wait for one: with the defaults, c10d 2.11's watchdog
//     sleeps 4 x TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC (60 s) before it aborts the communicator, and the
//     first group's heartbeat monitor, signalled to dump, sleeps TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (480 s)
//     and then aborts the process; a group's destructor joins both threads, so a stalled collective
//     held the process for a minute or more (the first GPU run's nccl_test);
//   - bound the non-blocking communicator calls by the timeout (c10d caches the first value read,
//     so the first group's timeout holds for the process).
void set_c10d_switches(std::chrono::milliseconds timeout) {
  static std::once_flag once;
  std::call_once(once, [timeout] {
    ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/1);  // the launcher's torchrun value is 1
    ::setenv("TORCH_NCCL_DUMP_ON_TIMEOUT", "0", 0);
    ::setenv("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "100", 0);
    const int64_t seconds = std::max<int64_t>(1, (timeout.count() + 999) / 1000);
    ::setenv("TORCH_NCCL_NONBLOCKING_TIMEOUT", std::to_string(seconds).c_str(), 0);
  });
}

const char* error_name(c10d::ErrorType e) {
  switch (e) {
    case c10d::ErrorType::TIMEOUT:
      return "a collective did not finish within the timeout";
    case c10d::ErrorType::COMM_ERROR:
      return "NCCL reported an error";
    case c10d::ErrorType::REMOTE_ERROR:
      return "another rank reported an error";
    case c10d::ErrorType::SUCCESS:
      break;
  }
  return "no error";
}

class NcclBackend;

// A collective in flight: c10d's work, held (with the tensors it keeps) until wait().
class NcclWork : public PendingWork {
 public:
  NcclWork(std::shared_ptr<NcclBackend> backend, c10::intrusive_ptr<c10d::Work> work, bool blocking)
      : backend_(std::move(backend)), work_(std::move(work)), blocking_(blocking) {}
  ~NcclWork() override;
  bool wait(std::chrono::milliseconds timeout) override;

 private:
  std::shared_ptr<NcclBackend> backend_;
  c10::intrusive_ptr<c10d::Work> work_;
  bool blocking_;
};

class NcclBackend : public Backend, public std::enable_shared_from_this<NcclBackend> {
 public:
  NcclBackend(const Store& store, int rank, int size, int device, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), device_(device), timeout_(timeout) {
    FSDP_CHECK(device >= 0, "[nccl] rank ", rank_, " sees no CUDA device; use the Gloo backend (--cpu)");
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_));
    set_c10d_switches(timeout);
    auto options = c10d::ProcessGroupNCCL::Options::create(/*is_high_priority_stream=*/true);
    options->timeout = timeout;
#ifdef NCCL_HAS_CONFIG
    options->config.blocking = 0;  // non-blocking init, polled until the timeout
#endif
    try {
      pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store.impl().prefixed, rank_, size_, options);
      // The communicator now, not at the first collective: a missing rank fails here, by name.
      pg_->eagerConnectSingleDevice(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_)));
    } catch (const std::exception& e) {
      if (pg_) pg_->abort();
      throw Error(str("[nccl] rank ", rank_, " of ", size_, " could not create its NCCL communicator on GPU ", device_,
                      " within ", format_seconds(static_cast<double>(timeout.count()) / 1000), ": ", brief_message(e),
                      "; a peer may have failed to start, or the GPUs cannot reach each other"));
    }
  }

  // Shut down when everything issued was waited for and nothing failed; abort otherwise (an error
  // unwinding, a peer gone), so NCCL never waits for collectives the other ranks will not join.
  // A failure the watchdog found that no call has read yet counts too. Releasing the group joins its
  // watchdog and heartbeat threads, which with our switches end at once.
  ~NcclBackend() override {
    try {
      if (failed_ || outstanding_ > 0 || std::uncaught_exceptions() > 0 ||
          pg_->getError() != c10d::ErrorType::SUCCESS)
        pg_->abort();
      else
        pg_->shutdown();
    } catch (const std::exception&) {
    }
    pg_.reset();
  }

  std::string name() const override {
    return "nccl";
  }
  int rank() const override {
    return rank_;
  }
  int size() const override {
    return size_;
  }
  std::optional<c10::DeviceType> device_type() const override {
    return c10::DeviceType::CUDA;
  }

  std::unique_ptr<PendingWork> all_gather(at::Tensor out, at::Tensor in, const std::string& label) override {
    return launch("all_gather", label, false, [&] { return allgather_flat(*pg_, out, in); });
  }

  std::unique_ptr<PendingWork> reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op,
                                              const std::string& label) override {
    c10d::ReduceScatterOptions o;
    o.reduceOp = to_c10d(op);
    return launch("reduce_scatter", label, false, [&] { return reduce_scatter_flat(*pg_, out, in, o); });
  }

  std::unique_ptr<PendingWork> all_reduce(at::Tensor tensor, ReduceOp op, const std::string& label) override {
    std::vector<at::Tensor> ts{tensor};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    return launch("all_reduce", label, false, [&] { return pg_->allreduce(ts, o); });
  }

  std::unique_ptr<PendingWork> broadcast(at::Tensor tensor, int root, const std::string& label) override {
    std::vector<at::Tensor> ts{tensor};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return launch("broadcast", label, false, [&] { return pg_->broadcast(ts, o); });
  }

  std::unique_ptr<PendingWork> all_to_all(at::Tensor out, at::Tensor in, std::vector<int64_t> out_splits,
                                          std::vector<int64_t> in_splits, const std::string& label) override {
    c10d::AllToAllOptions o;
    return launch("all_to_all", label, false, [&] { return pg_->alltoall_base(out, in, out_splits, in_splits, o); });
  }

  std::unique_ptr<PendingWork> barrier(const std::string& label) override {
    c10d::BarrierOptions o;
    o.device_ids = {static_cast<int64_t>(device_)};
    return launch("barrier", label, true, [&] { return pg_->barrier(o); });
  }

  // Throws, naming what c10d's watchdog found, once it has aborted the communicator.
  void check_failure() {
    const c10d::ErrorType e = pg_->getError();
    if (e == c10d::ErrorType::SUCCESS) return;
    failed_ = true;
    throw Error(str("[nccl] rank ", rank_, " of ", size_, ": ", error_name(e),
                    " and the watchdog aborted the communicator", failed_collective(),
                    "; the last collectives this rank issued: ", recent(),
                    e == c10d::ErrorType::TIMEOUT
                        ? str("; with dist_timeout ", format_seconds(timeout_.count() / 1000.0),
                              ": a rank is missing, hung or called collectives in a different order")
                        : std::string()));
  }
  void waited() {
    --outstanding_;
  }

 private:
  static c10d::ReduceOp to_c10d(ReduceOp op) {
    switch (op) {
      case ReduceOp::kAvg:
        return c10d::ReduceOp(c10d::ReduceOp::AVG);
      case ReduceOp::kMax:
        return c10d::ReduceOp(c10d::ReduceOp::MAX);
      case ReduceOp::kSum:
        break;
    }
    return c10d::ReduceOp(c10d::ReduceOp::SUM);
  }

  template <typename Issue>
  std::unique_ptr<PendingWork> launch(const char* what, const std::string& label, bool blocking, Issue issue) {
    check_failure();
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = issue();
    } catch (const std::exception& e) {
      failed_ = true;
      check_failure();
      throw Error(str("[nccl] ", what, label.empty() ? "" : " (" + label + ")", " on rank ", rank_, " of ", size_,
                      " could not be issued: ", brief_message(e)));
    }
    c10::intrusive_ptr<c10::ivalue::Future> result;
    try {  // c10d's WorkNCCL has one; a Work without it (Work's default throws) is named without it
      result = work->getFutureResult();
    } catch (const std::exception&) {
    }
    remember(work->getSequencenumber(), what, label, std::move(result));
    ++outstanding_;
    return std::make_unique<NcclWork>(shared_from_this(), std::move(work), blocking);
  }

  // The last few collectives by c10d's sequence number, for the failure message, each with the
  // result c10d's watchdog marks (TIMEOUT or COMM_ERROR) on the collective it caught.
  struct Issued {
    std::string name;
    c10::intrusive_ptr<c10::ivalue::Future> result;
  };
  void remember(uint64_t seq, const char* what, const std::string& label,
                c10::intrusive_ptr<c10::ivalue::Future> result) {
    std::lock_guard<std::mutex> lock(mu_);
    recent_.push_back({str("SeqNum ", seq, " ", what, label.empty() ? "" : " (" + label + ")"), std::move(result)});
    if (recent_.size() > 6) recent_.pop_front();
  }
  std::string recent() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (const Issued& r : recent_) out += (out.empty() ? "" : ", ") + r.name;
    return out.empty() ? "none" : out;
  }
  // ": <the collective> did not finish within the timeout" for the one the watchdog marked, if any.
  std::string failed_collective() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Issued& r : recent_) {
      if (!r.result || !r.result->completed() || r.result->hasError()) continue;
      const auto code = static_cast<c10d::WorkResult>(r.result->value().toInt());
      if (code == c10d::WorkResult::TIMEOUT)
        return str(" after ", r.name, " did not finish within ", format_seconds(timeout_.count() / 1000.0));
      if (code == c10d::WorkResult::COMM_ERROR) return str(" after NCCL failed in ", r.name);
    }
    return " (its log line above names the collective by SeqNum and OpType)";
  }

  int rank_, size_, device_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  std::atomic<int64_t> outstanding_{0};  // issued and not yet waited for
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::deque<Issued> recent_;
};

NcclWork::~NcclWork() {
  if (work_) backend_->waited();  // never waited: the backend still counts it outstanding
}

bool NcclWork::wait(std::chrono::milliseconds timeout) {
  backend_->check_failure();
  if (!blocking_) {
    work_->wait();  // the caller's current stream waits on the GPU; c10d lets go of the tensors
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!work_->isCompleted()) {
      backend_->check_failure();
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    work_->wait();
  }
  backend_->waited();
  work_.reset();
  backend_->check_failure();
  return true;
}

}  // namespace

int visible_gpus() {
  int devices = 0;  // the runtime's own count: quiet without a driver (0), unlike LibTorch's
  return cudaGetDeviceCount(&devices) == cudaSuccess ? devices : 0;
}

bool nccl_usable() {
  return visible_gpus() > 0;
}

std::shared_ptr<Backend> make_nccl_backend(const Store& store, int rank, int size, int device,
                                           std::chrono::milliseconds timeout) {
  return std::make_shared<NcclBackend>(store, rank, size, device, timeout);
}

}  // namespace fsdp::dist

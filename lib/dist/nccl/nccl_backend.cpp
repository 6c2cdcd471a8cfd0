#include "dist/nccl/nccl_backend.h"

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "util/error.h"
#include "util/strings.h"

// Every CUDA and NCCL call is checked; the message names the call, where, the library's error
// string and this rank.
#define FSDP_CUDA_CHECK(call, rank)                                                                                  \
  do {                                                                                                               \
    cudaError_t err_ = (call);                                                                                       \
    if (err_ != cudaSuccess)                                                                                         \
      throw ::fsdp::Error(::fsdp::str("[cuda] ", #call, " failed at ", __FILE__, ":", __LINE__, " on rank ", (rank), \
                                      ": ", cudaGetErrorString(err_)));                                              \
  } while (0)

#define FSDP_NCCL_CHECK(call, rank, what)                                                                   \
  do {                                                                                                      \
    ncclResult_t res_ = (call);                                                                             \
    if (res_ != ncclSuccess)                                                                                \
      throw ::fsdp::Error(::fsdp::str("[nccl] ", what, ": ", #call, " failed at ", __FILE__, ":", __LINE__, \
                                      " on rank ", (rank), ": ", ncclGetErrorString(res_), " (",            \
                                      ncclGetLastError(nullptr), ")"));                                     \
  } while (0)

namespace fsdp::dist {

namespace {

ncclDataType_t to_nccl(at::ScalarType t) {
  static const std::pair<at::ScalarType, ncclDataType_t> kTypes[] = {
      {at::kFloat, ncclFloat32}, {at::kDouble, ncclFloat64}, {at::kHalf, ncclFloat16}, {at::kBFloat16, ncclBfloat16},
      {at::kInt, ncclInt32},     {at::kLong, ncclInt64},     {at::kByte, ncclUint8},   {at::kChar, ncclInt8},
      {at::kBool, ncclUint8}};
  for (const auto& [torch_type, nccl_type] : kTypes)
    if (torch_type == t) return nccl_type;
  throw Error(str("[nccl] unsupported dtype ", c10::toString(t)));
}

// A CUDA event shared by the work handle and the watchdog; destroyed when both let go.
using Event = std::shared_ptr<CUevent_st>;

// One collective in flight, as the watchdog sees it. `buffers` keeps its input and output alive
// until `done` has passed: the caching allocator cannot hand their memory to the compute stream
// while this stream still reads or writes it (instead of recordStream, which would tie every later
// reuse of those blocks to this stream).
struct InFlight {
  Event done;
  std::chrono::steady_clock::time_point start;
  std::string what;
  std::vector<at::Tensor> buffers;
};

class NcclBackend;

class NcclWork : public PendingWork {
 public:
  NcclWork(std::shared_ptr<NcclBackend> backend, Event done, bool blocking)
      : backend_(std::move(backend)), done_(std::move(done)), blocking_(blocking) {}
  bool wait(std::chrono::milliseconds timeout) override;

 private:
  std::shared_ptr<NcclBackend> backend_;
  Event done_;
  bool blocking_;
};

class NcclBackend : public Backend, public std::enable_shared_from_this<NcclBackend> {
 public:
  NcclBackend(const Store& store, int rank, int size, int device, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), device_(device), timeout_(timeout) {
    FSDP_CHECK(device >= 0, "[nccl] rank ", rank_, " sees no CUDA device; use the Gloo backend (--cpu)");
    FSDP_CUDA_CHECK(cudaSetDevice(device_), rank_);

    ncclUniqueId id;
    Store s = store.with_prefix("nccl/");
    if (rank_ == 0) {
      FSDP_NCCL_CHECK(ncclGetUniqueId(&id), rank_, "creating the communicator");
      s.set("unique_id", std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      const std::string bytes = s.get("unique_id");
      FSDP_ASSERT(bytes.size() == sizeof(id), "NCCL unique id of ", bytes.size(), " bytes");
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    FSDP_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_), rank_, "creating the communicator");
    int lo = 0, hi = 0;
    FSDP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi), rank_);
    FSDP_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, hi), rank_);
    FSDP_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)), rank_);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    cudaStreamSynchronize(stream_);
    in_flight_.clear();
    if (comm_) aborted_ ? (void)0 : (void)ncclCommDestroy(comm_);
    cudaFree(barrier_buf_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<PendingWork> all_gather(at::Tensor out, at::Tensor in) override {
    return launch("all_gather", {out, in}, false, [&] {
      FSDP_NCCL_CHECK(
          ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), to_nccl(in.scalar_type()), comm_, stream_), rank_,
          "all_gather");
    });
  }

  std::unique_ptr<PendingWork> reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op) override {
    return launch("reduce_scatter", {out, in}, false, [&] {
      FSDP_NCCL_CHECK(ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), to_nccl(in.scalar_type()),
                                        op == ReduceOp::kAvg ? ncclAvg : ncclSum, comm_, stream_),
                      rank_, "reduce_scatter");
    });
  }

  std::unique_ptr<PendingWork> all_reduce(at::Tensor t, ReduceOp op) override {
    return launch("all_reduce", {t}, false, [&] {
      FSDP_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), to_nccl(t.scalar_type()),
                                    op == ReduceOp::kAvg ? ncclAvg : ncclSum, comm_, stream_),
                      rank_, "all_reduce");
    });
  }

  std::unique_ptr<PendingWork> broadcast(at::Tensor t, int root) override {
    return launch("broadcast", {t}, false, [&] {
      FSDP_NCCL_CHECK(
          ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), to_nccl(t.scalar_type()), root, comm_, stream_), rank_,
          "broadcast");
    });
  }

  std::unique_ptr<PendingWork> barrier() override {
    return launch("barrier", {}, true, [&] {
      FSDP_NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_), rank_,
                      "barrier");
    });
  }

  // Throws the watchdog's error, if it aborted the communicator.
  void rethrow_failure() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.empty()) throw Error(failure_);
  }

  int rank_, size_;

 private:
  template <typename Enqueue>
  std::unique_ptr<PendingWork> launch(const char* what, std::vector<at::Tensor> tensors, bool blocking,
                                      Enqueue enqueue) {
    rethrow_failure();
    FSDP_CUDA_CHECK(cudaSetDevice(device_), rank_);
    // The collective starts after everything the caller's stream has queued (the producer of `in`).
    cudaStream_t compute = c10::cuda::getCurrentCUDAStream(device_).stream();
    cudaEvent_t ready, raw_done;
    FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), rank_);
    FSDP_CUDA_CHECK(cudaEventRecord(ready, compute), rank_);
    FSDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0), rank_);
    cudaEventDestroy(ready);
    enqueue();
    FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&raw_done, cudaEventDisableTiming), rank_);
    Event done(raw_done, [](cudaEvent_t e) { cudaEventDestroy(e); });
    FSDP_CUDA_CHECK(cudaEventRecord(done.get(), stream_), rank_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      release_finished();
      in_flight_.push_back({done, std::chrono::steady_clock::now(), what, std::move(tensors)});
    }
    cv_.notify_all();
    return std::make_unique<NcclWork>(shared_from_this(), done, blocking);
  }

  // Drops the collectives whose event has passed, and with them their buffers. Holding mu_.
  void release_finished() {
    while (!in_flight_.empty() && cudaEventQuery(in_flight_.front().done.get()) == cudaSuccess) in_flight_.pop_front();
  }

  // Aborts the communicator when a collective overstays the timeout or NCCL reports an async error,
  // so a hang becomes an error on this rank instead of a process that never ends. After the abort
  // the communicator is freed: it is never touched again.
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_ && !aborted_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      release_finished();
      const std::string problem = find_problem();
      if (problem.empty()) continue;
      failure_ = str("[nccl] rank ", rank_, " of ", size_, ": ", problem, "; the communicator was aborted");
      ncclCommAbort(comm_);
      aborted_ = true;
    }
  }

  // What makes the watchdog abort: NCCL's asynchronous error, or the oldest collective overdue.
  // "" when all is well. Holding mu_, before any abort.
  std::string find_problem() {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess)
      return str("NCCL reported ", ncclGetErrorString(async), " (", ncclGetLastError(comm_), ")");
    if (!in_flight_.empty() && std::chrono::steady_clock::now() - in_flight_.front().start > timeout_)
      return str(in_flight_.front().what, " did not finish within ", static_cast<double>(timeout_.count()) / 1000.0,
                 " s; a rank is missing, hung or called collectives in a different order");
    return "";
  }

  int device_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* barrier_buf_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<InFlight> in_flight_;
  std::string failure_;
  bool stop_ = false;
  bool aborted_ = false;
  std::thread watchdog_;

  friend class NcclWork;
};

bool NcclWork::wait(std::chrono::milliseconds timeout) {
  backend_->rethrow_failure();
  if (!blocking_) {
    // The caller's stream waits on the GPU; the host goes on.
    cudaStream_t compute = c10::cuda::getCurrentCUDAStream().stream();
    FSDP_CUDA_CHECK(cudaStreamWaitEvent(compute, done_.get(), 0), backend_->rank_);
    return true;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (cudaEventQuery(done_.get()) != cudaSuccess) {
    backend_->rethrow_failure();
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

}  // namespace

int visible_gpus() {
  int devices = 0;
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

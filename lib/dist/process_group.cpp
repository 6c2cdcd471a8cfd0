#include "dist/process_group.h"

#include <ATen/record_function.h>

#include <cstdlib>

#include "dist/gloo/gloo_backend.h"
#include "dist/nccl/nccl_backend.h"
#include "dist/store.h"
#include "dist/torch_compat.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdp::dist {

namespace {

const char* name_of(Collective c) {
  return kCollectiveNames[static_cast<size_t>(c)];
}

int64_t nbytes(const at::Tensor& t) {
  return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
}

void check_tensor(const at::Tensor& t, const char* what, Collective c) {
  FSDP_ASSERT(t.defined(), name_of(c), ": ", what, " is undefined");
  FSDP_ASSERT(t.is_contiguous(), name_of(c), ": ", what, " must be contiguous");
}

// The single-process group: collectives are copies.
class LocalBackend : public Backend {
 public:
  std::string name() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::unique_ptr<PendingWork> all_gather(at::Tensor out, at::Tensor in) override {
    if (!out.is_same(in)) out.copy_(in);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<PendingWork> reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp) override {
    if (!out.is_same(in)) out.copy_(in);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<PendingWork> all_reduce(at::Tensor, ReduceOp) override { return std::make_unique<DoneWork>(); }
  std::unique_ptr<PendingWork> broadcast(at::Tensor, int) override { return std::make_unique<DoneWork>(); }
  std::unique_ptr<PendingWork> barrier() override { return std::make_unique<DoneWork>(); }
};

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

int env_port() {
  const char* v = std::getenv("MASTER_PORT");
  FSDP_CHECK(v && *v, "[dist] MASTER_PORT is not set; start workers with `fsdptrain launch` (or torchrun)");
  auto n = parse_int(v);
  FSDP_CHECK(n && *n >= 0, "[dist] MASTER_PORT=", quoted(v), " is not a whole number >= 0");
  return static_cast<int>(*n);
}

}  // namespace

int64_t ByteCounters::total() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

int64_t bytes_sent(Collective c, int64_t s, int world_size) {
  if (world_size <= 1) return 0;
  const int64_t w = world_size;
  switch (c) {
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return s * (w - 1) / w;
    case Collective::kAllReduce:
      return 2 * s * (w - 1) / w;
    case Collective::kBroadcast:
      return s;
    case Collective::kBarrier:
      return 0;
  }
  return 0;
}

namespace {

// A collective's error that says the other side's connection went away.
bool peer_gone(const std::string& why) {
  for (const char* sign : {"Connection closed by peer", "Connection reset by peer", "Broken pipe", "EOF"})
    if (why.find(sign) != std::string::npos) return true;
  return false;
}

}  // namespace

Work::Work(std::unique_ptr<PendingWork> pending, Collective c, int rank, int size, std::chrono::milliseconds timeout,
           int64_t bytes)
    : pending_(std::move(pending)), collective_(c), rank_(rank), size_(size), timeout_(timeout), bytes_(bytes) {}

void Work::wait() {
  if (!pending_) return;
  RECORD_USER_SCOPE(str("wait ", name_of(collective_)));
  const std::string what = str(name_of(collective_), " of ", format_bytes(bytes_), " on rank ", rank_, " of ", size_);
  bool ok = false;
  try {
    ok = pending_->wait(timeout_);
  } catch (const std::exception& e) {
    const std::string why = dynamic_cast<const Error*>(&e) ? std::string(e.what()) : brief_message(e);
    throw Error(str("[dist] ", what, " failed: ", why, peer_gone(why)
                                                         ? "; a peer rank is gone (its process ended or its machine "
                                                           "went away): see the first failure above"
                                                         : "; another rank probably failed first (see its output)"));
  }
  if (!ok)
    throw Error(str("[dist] ", what, " did not finish within ", static_cast<double>(timeout_.count()) / 1000.0,
                    " s; a rank is missing, hung or called collectives in a different order"));
  pending_.reset();
}

ProcessGroup::ProcessGroup(std::shared_ptr<Backend> backend, std::chrono::milliseconds timeout,
                           std::shared_ptr<Store> store, int gpu)
    : backend_(std::move(backend)),
      timeout_(timeout),
      counters_(std::make_shared<ByteCounters>()),
      store_(std::move(store)),
      gpu_(gpu) {}

ProcessGroup ProcessGroup::new_group(const std::vector<int>& ranks) const { return make_group(ranks, false); }

ProcessGroup ProcessGroup::new_host_group(const std::vector<int>& ranks) const { return make_group(ranks, true); }

ProcessGroup ProcessGroup::make_group(const std::vector<int>& ranks, bool host) const {
  int index = -1;
  std::string key = str("group", (*subgroups_made_)++, "/");
  for (size_t i = 0; i < ranks.size(); ++i) {
    FSDP_ASSERT(ranks[i] >= 0 && ranks[i] < size(), "new_group: rank ", ranks[i], " outside the group of ", size());
    FSDP_ASSERT(i == 0 || ranks[i] > ranks[i - 1], "new_group: ranks must ascend");
    if (ranks[i] == rank()) index = static_cast<int>(i);
    key += str(i ? "_" : "", ranks[i]);
  }
  FSDP_ASSERT(index >= 0, "new_group: rank ", rank(), " is not a member");
  if (ranks.size() == 1) return make_single_process_group();
  if (static_cast<int>(ranks.size()) == size() && !host) return *this;
  FSDP_ASSERT(store_ != nullptr, "new_group on a group without a store");
  if (host) key = "host" + key;
  // Each member list gets its own key space in the store, so several subgroups can form at once.
  const Store sub = store_->with_prefix(key + "/");
  const int n = static_cast<int>(ranks.size());
  std::shared_ptr<Backend> b = backend_->name() == "nccl" && !host
                                   ? make_nccl_backend(sub, index, n, gpu_, timeout_)
                                   : make_gloo_backend(sub.with_prefix("gloo/"), index, n, timeout_);
  return ProcessGroup(std::move(b), timeout_, std::make_shared<Store>(sub), gpu_);
}

// A profiler range around a collective's issue (named only while a profiler records).
#define FSDP_TRACE_COLLECTIVE(c, bytes) \
  RECORD_USER_SCOPE(str(backend_->name(), " ", name_of(c), " ", format_bytes(bytes)))

Work ProcessGroup::record(Collective c, int64_t s, std::unique_ptr<PendingWork> pending) {
  const size_t i = static_cast<size_t>(c);
  const int64_t sent = bytes_sent(c, s, size());
  counters_->bytes[i] += sent;
  counters_->calls[i] += 1;
  return Work(std::move(pending), c, rank(), size(), timeout_, s);
}

Work ProcessGroup::all_gather(const at::Tensor& out, const at::Tensor& in) {
  check_tensor(out, "out", Collective::kAllGather);
  check_tensor(in, "in", Collective::kAllGather);
  FSDP_ASSERT(out.scalar_type() == in.scalar_type(), "all_gather: dtypes differ");
  FSDP_ASSERT(out.numel() == in.numel() * size(), "all_gather: out has ", out.numel(), " elements, expected ",
              in.numel(), " x ", size());
  FSDP_TRACE_COLLECTIVE(Collective::kAllGather, nbytes(out));
  return record(Collective::kAllGather, nbytes(out), backend_->all_gather(out, in));
}

Work ProcessGroup::reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) {
  check_tensor(out, "out", Collective::kReduceScatter);
  check_tensor(in, "in", Collective::kReduceScatter);
  FSDP_ASSERT(out.scalar_type() == in.scalar_type(), "reduce_scatter: dtypes differ");
  FSDP_ASSERT(in.numel() == out.numel() * size(), "reduce_scatter: in has ", in.numel(), " elements, expected ",
              out.numel(), " x ", size());
  FSDP_ASSERT(op == ReduceOp::kSum || at::isFloatingType(in.scalar_type()), "reduce_scatter: avg needs floats");
  FSDP_TRACE_COLLECTIVE(Collective::kReduceScatter, nbytes(in));
  return record(Collective::kReduceScatter, nbytes(in), backend_->reduce_scatter(out, in, op));
}

Work ProcessGroup::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "tensor", Collective::kAllReduce);
  FSDP_ASSERT(op == ReduceOp::kSum || at::isFloatingType(tensor.scalar_type()), "all_reduce: avg needs floats");
  FSDP_TRACE_COLLECTIVE(Collective::kAllReduce, nbytes(tensor));
  return record(Collective::kAllReduce, nbytes(tensor), backend_->all_reduce(tensor, op));
}

Work ProcessGroup::broadcast(const at::Tensor& tensor, int root) {
  check_tensor(tensor, "tensor", Collective::kBroadcast);
  FSDP_ASSERT(root >= 0 && root < size(), "broadcast: root ", root, " outside the group of ", size());
  FSDP_TRACE_COLLECTIVE(Collective::kBroadcast, nbytes(tensor));
  return record(Collective::kBroadcast, nbytes(tensor), backend_->broadcast(tensor, root));
}

Work ProcessGroup::barrier() {
  return record(Collective::kBarrier, 0, backend_->barrier());
}

ProcessGroup make_single_process_group() {
  return ProcessGroup(std::make_shared<LocalBackend>(), std::chrono::minutes(10));
}

ProcessGroup init_process_group(const GroupOptions& options) {
  std::chrono::milliseconds timeout = std::chrono::seconds(600);
  if (options.timeout) {
    timeout = *options.timeout;
  } else if (const char* t = std::getenv("FSDPTRAIN_DIST_TIMEOUT"); t && *t) {
    auto seconds = parse_float(t);
    FSDP_CHECK(seconds && *seconds > 0, "[dist] FSDPTRAIN_DIST_TIMEOUT=", quoted(t), " is not a number of seconds > 0");
    timeout = std::chrono::milliseconds(static_cast<int64_t>(*seconds * 1000));
  }
  const WorkerContext ctx = options.context ? *options.context : worker_context(options.backend == "gloo");
  if (ctx.world_size == 1) return make_single_process_group();
  const int world_size = ctx.world_size, rank = ctx.rank;
  StoreOptions so;
  so.host = env_or("MASTER_ADDR", "127.0.0.1");
  so.port = env_port();
  so.timeout = timeout;
  // Under a launcher the store already exists (torchrun's "agent store"); otherwise rank 0 serves.
  const bool agent_store = env_or("TORCHELASTIC_USE_AGENT_STORE", "") == "True";
  so.is_server = !agent_store && rank == 0;
  so.prefix = agent_store ? str("/worker/attempt_", env_or("TORCHELASTIC_RESTART_COUNT", "0"), "/") : "";
  auto store = std::make_shared<Store>(so);

  const std::string backend = options.backend == "auto" ? ctx.backend : options.backend;
  std::shared_ptr<Backend> b;
  if (backend == "nccl")
    b = make_nccl_backend(*store, rank, world_size, ctx.gpu, timeout);
  else if (backend == "gloo")
    b = make_gloo_backend(store->with_prefix("gloo/"), rank, world_size, timeout);
  else
    throw InputError(str("[dist] unknown backend ", quoted(backend), "; expected gloo, nccl or auto"));
  return ProcessGroup(std::move(b), timeout, std::move(store), ctx.gpu);
}

}  // namespace fsdp::dist

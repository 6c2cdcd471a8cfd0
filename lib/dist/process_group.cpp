#include "dist/process_group.h"

#include <ATen/ops/empty.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "dist/gloo/gloo_backend.h"
#include "dist/nccl/nccl_backend.h"
#include "dist/store.h"
#include "dist/torch_compat.h"
#include "util/env.h"
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
  std::optional<c10::DeviceType> device_type() const override { return std::nullopt; }
  std::unique_ptr<PendingWork> all_gather(at::Tensor out, at::Tensor in, const std::string&) override {
    if (!out.is_same(in)) out.copy_(in);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<PendingWork> reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp, const std::string&) override {
    if (!out.is_same(in)) out.copy_(in);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<PendingWork> all_reduce(at::Tensor, ReduceOp, const std::string&) override {
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<PendingWork> broadcast(at::Tensor, int, const std::string&) override {
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<PendingWork> barrier(const std::string&) override { return std::make_unique<DoneWork>(); }
  std::unique_ptr<PendingWork> all_to_all(at::Tensor out, at::Tensor in, std::vector<int64_t>, std::vector<int64_t>,
                                          const std::string&) override {
    if (!out.is_same(in)) out.copy_(in);
    return std::make_unique<DoneWork>();
  }
};

int env_port() {
  const int port = env_count("MASTER_PORT", -1);
  FSDP_CHECK(port >= 0, "[dist] MASTER_PORT is not set; start workers with `fsdptrain launch` (or torchrun)");
  return port;
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
    case Collective::kAllToAll:
      return s * (w - 1) / w;
    case Collective::kBroadcast:
    case Collective::kShift:
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

Work::Work(std::unique_ptr<PendingWork> pending, Collective c, std::string label, int rank, int size,
           std::chrono::milliseconds timeout, int64_t bytes)
    : pending_(std::move(pending)),
      collective_(c),
      label_(std::move(label)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      bytes_(bytes) {}

void Work::wait() {
  if (!pending_) return;
  RECORD_USER_SCOPE(str("wait ", name_of(collective_)));
  const std::string what = str(name_of(collective_), label_.empty() ? "" : " (" + label_ + ")", " of ",
                               format_bytes(bytes_), " on rank ", rank_, " of ", size_);
  bool ok = false;
  try {
    ok = pending_->wait(timeout_);
  } catch (const std::exception& e) {
    const std::string why = dynamic_cast<const Error*>(&e) ? std::string(e.what()) : brief_message(e);
    throw Error(str("[dist] ", what, " failed: ", why,
                    peer_gone(why) ? "; a peer rank is gone (its process ended or its machine "
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

ProcessGroup ProcessGroup::new_group(const std::vector<int>& ranks, bool own) const {
  return make_group(ranks, false, own);
}

ProcessGroup ProcessGroup::new_host_group(const std::vector<int>& ranks) const {
  return make_group(ranks, true);
}

ProcessGroup ProcessGroup::make_group(const std::vector<int>& ranks, bool host, bool own) const {
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
  if (static_cast<int>(ranks.size()) == size() && !host && !own) return *this;
  FSDP_ASSERT(store_ != nullptr, "new_group on a group without a store");
  if (host) key = "host" + key;
  // Each member list gets its own key space in the store, so several subgroups can form at once.
  const Store sub = store_->with_prefix(key + "/");
  const int n = static_cast<int>(ranks.size());
  std::shared_ptr<Backend> b = backend_->name() == "nccl" && !host
                                   ? make_nccl_backend(sub, index, n, gpu_, timeout_)
                                   : make_gloo_backend(sub.with_prefix("gloo/"), index, n, timeout_);
  ProcessGroup group(std::move(b), timeout_, std::make_shared<Store>(sub), gpu_);
  if (check_) group.enable_debug_checks();
  return group;
}

void ProcessGroup::enable_debug_checks() {
  if (check_ || is_local()) return;
  FSDP_ASSERT(store_ != nullptr, "enable_debug_checks on a group without a store");
  check_ = make_gloo_backend(store_->with_prefix("check/gloo/"), rank(), size(), timeout_);
}

namespace {

// One rank's collective as the cross-rank check compares it: the operation, the dtype, both
// sizes, the root or reduction, and the start of the label.
struct Fingerprint {
  int64_t op = 0, dtype = -1, out_numel = 0, in_numel = 0, detail = 0;
  char label[88] = {};
};
static_assert(sizeof(Fingerprint) == 128, "a fingerprint is 128 bytes");

Fingerprint fingerprint_of(Collective c, const std::string& label, const at::Tensor* out, const at::Tensor* in,
                           int64_t detail) {
  Fingerprint f;
  f.op = static_cast<int64_t>(c);
  const at::Tensor* any = out ? out : in;
  if (any) f.dtype = static_cast<int64_t>(any->scalar_type());
  f.out_numel = out ? out->numel() : 0;
  f.in_numel = in ? in->numel() : 0;
  f.detail = detail;
  std::memcpy(f.label, label.data(), std::min(label.size(), sizeof(f.label) - 1));
  return f;
}

bool same(const Fingerprint& a, const Fingerprint& b) {
  return a.op == b.op && a.dtype == b.dtype && a.out_numel == b.out_numel && a.in_numel == b.in_numel &&
         a.detail == b.detail;
}

std::string describe(const Fingerprint& f) {
  std::string what = kCollectiveNames[static_cast<size_t>(f.op)];
  if (f.label[0]) what += str(" (", f.label, ")");
  if (f.dtype < 0) return what;
  what += str(" of ", to_lower(c10::toString(static_cast<at::ScalarType>(f.dtype))));
  if (f.op == static_cast<int64_t>(Collective::kAllGather) || f.op == static_cast<int64_t>(Collective::kReduceScatter))
    return what + str(", ", f.in_numel, " elements in and ", f.out_numel, " out");
  what += str(", ", plural(f.out_numel + f.in_numel, "element"));
  if (f.op == static_cast<int64_t>(Collective::kBroadcast)) what += str(", root ", f.detail);
  return what;
}

}  // namespace

// Every rank gathers every rank's fingerprint of the collective it is about to issue; all of them
// throw the same message when one differs.
void ProcessGroup::check_across_ranks(Collective c, const std::string& label, const at::Tensor* out,
                                      const at::Tensor* in, int64_t detail) {
  const int w = size();
  const Fingerprint mine = fingerprint_of(c, label, out, in, detail);
  at::Tensor all = at::empty({w * static_cast<int64_t>(sizeof(Fingerprint))}, at::kByte);
  at::Tensor slot = all.narrow(0, rank() * static_cast<int64_t>(sizeof(Fingerprint)), sizeof(Fingerprint));
  std::memcpy(slot.data_ptr(), &mine, sizeof(Fingerprint));
  int64_t number = 1;
  for (const int64_t calls : counters_->calls) number += calls;
  Work(check_->all_gather(all, slot, "debug check"), Collective::kAllGather,
       "the debug check before collective #" + std::to_string(number), rank(), w, timeout_, all.numel())
      .wait();
  const auto* prints = reinterpret_cast<const Fingerprint*>(all.data_ptr());
  for (int r = 1; r < w; ++r) {
    if (same(prints[0], prints[r])) continue;
    throw Error(str("[dist] debug: collective #", number, " of this group differs across its ", w,
                    " ranks: rank 0 calls ", describe(prints[0]), ", rank ", r, " calls ", describe(prints[r]),
                    ". The ranks' code paths diverged here; without this check (debug: true) they would hang until "
                    "dist_timeout or compute garbage"));
  }
}

// A profiler range around a collective's issue (named only while a profiler records).
#define FSDP_TRACE_COLLECTIVE(c, bytes) \
  RECORD_USER_SCOPE(str(backend_->name(), " ", name_of(c), " ", format_bytes(bytes)))

template <typename Issue>
Work ProcessGroup::issue(Collective c, const std::string& label,
                         std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors, int64_t s,
                         int64_t detail, Issue fn, std::optional<int64_t> sent) {
  const at::Tensor* out = nullptr;
  const at::Tensor* in = nullptr;
  for (const auto& [what, t] : tensors) {
    check_tensor(*t, what, c);
    // A host tensor handed to NCCL (or a GPU tensor to Gloo) is our bug: named before it is issued.
    const std::optional<c10::DeviceType> want = backend_->device_type();
    FSDP_ASSERT(!want || t->device().type() == *want, name_of(c), label.empty() ? "" : " (" + label + ")", " on rank ",
                rank(), ": ", what, " is a ", c10::DeviceTypeName(t->device().type(), true), " tensor, but the ",
                backend_->name(), " backend moves ", c10::DeviceTypeName(*want, true), " tensors only");
    (std::string(what) == "in" ? in : out) = t;
  }
  // Unequal splits: the ranks' sizes differ by design, so the check compares the rest.
  if (check_) check_across_ranks(c, label, sent ? nullptr : out, sent ? nullptr : in, detail);
  FSDP_TRACE_COLLECTIVE(c, s);
  std::unique_ptr<PendingWork> pending = fn();
  const size_t i = static_cast<size_t>(c);
  counters_->bytes[i] += sent ? *sent : bytes_sent(c, s, size());
  counters_->calls[i] += 1;
  return Work(std::move(pending), c, label, rank(), size(), timeout_, s);
}

Work ProcessGroup::all_gather(const at::Tensor& out, const at::Tensor& in, const std::string& label) {
  FSDP_ASSERT(out.scalar_type() == in.scalar_type(), "all_gather: dtypes differ");
  FSDP_ASSERT(out.numel() == in.numel() * size(), "all_gather: out has ", out.numel(), " elements, expected ",
              in.numel(), " x ", size());
  return issue(Collective::kAllGather, label, {{"out", &out}, {"in", &in}}, nbytes(out), 0,
               [&] { return backend_->all_gather(out, in, label); });
}

Work ProcessGroup::reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op, const std::string& label) {
  FSDP_ASSERT(out.scalar_type() == in.scalar_type(), "reduce_scatter: dtypes differ");
  FSDP_ASSERT(in.numel() == out.numel() * size(), "reduce_scatter: in has ", in.numel(), " elements, expected ",
              out.numel(), " x ", size());
  FSDP_ASSERT(op != ReduceOp::kMax, "reduce_scatter: sum or avg, not max");
  FSDP_ASSERT(op == ReduceOp::kSum || at::isFloatingType(in.scalar_type()), "reduce_scatter: avg needs floats");
  return issue(Collective::kReduceScatter, label, {{"out", &out}, {"in", &in}}, nbytes(in), static_cast<int64_t>(op),
               [&] { return backend_->reduce_scatter(out, in, op, label); });
}

Work ProcessGroup::all_reduce(const at::Tensor& tensor, ReduceOp op, const std::string& label) {
  FSDP_ASSERT(op == ReduceOp::kSum || at::isFloatingType(tensor.scalar_type()), "all_reduce: avg and max need floats");
  return issue(Collective::kAllReduce, label, {{"tensor", &tensor}}, nbytes(tensor), static_cast<int64_t>(op),
               [&] { return backend_->all_reduce(tensor, op, label); });
}

Work ProcessGroup::broadcast(const at::Tensor& tensor, int root, const std::string& label) {
  FSDP_ASSERT(root >= 0 && root < size(), "broadcast: root ", root, " outside the group of ", size());
  return issue(Collective::kBroadcast, label, {{"tensor", &tensor}}, nbytes(tensor), root,
               [&] { return backend_->broadcast(tensor, root, label); });
}

Work ProcessGroup::barrier(const std::string& label) {
  return issue(Collective::kBarrier, label, {}, 0, 0, [&] { return backend_->barrier(label); });
}

Work ProcessGroup::all_to_all(const at::Tensor& out, const at::Tensor& in, const std::string& label) {
  FSDP_ASSERT(out.scalar_type() == in.scalar_type(), "all_to_all: dtypes differ");
  FSDP_ASSERT(out.numel() == in.numel() && in.numel() % size() == 0, "all_to_all: ", in.numel(), " elements in and ",
              out.numel(), " out, which must be equal and divide by ", size());
  return issue(Collective::kAllToAll, label, {{"out", &out}, {"in", &in}}, nbytes(in), 0, [&] {
    return backend_->all_to_all(out.reshape({-1}), in.reshape({-1}), {}, {}, label);
  });
}

Work ProcessGroup::all_to_all(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_rows,
                              const std::vector<int64_t>& in_rows, const std::string& label) {
  const auto w = static_cast<size_t>(size());
  FSDP_ASSERT(out.scalar_type() == in.scalar_type(), "all_to_all: dtypes differ");
  FSDP_ASSERT(out_rows.size() == w && in_rows.size() == w, "all_to_all: ", out_rows.size(), " and ", in_rows.size(),
              " split sizes for a group of ", w);
  // Elements a row, from the shapes (a tensor of no rows still has its row's size).
  auto row_of = [](const at::Tensor& t) {
    int64_t n = 1;
    for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
    return n;
  };
  const int64_t row = row_of(in), out_row = row_of(out);
  int64_t sent_rows = 0, in_total = 0, out_total = 0;
  std::vector<int64_t> out_splits, in_splits;
  for (size_t r = 0; r < w; ++r) {
    in_total += in_rows[r];
    out_total += out_rows[r];
    if (static_cast<int>(r) != rank()) sent_rows += in_rows[r];
    out_splits.push_back(out_rows[r] * row);
    in_splits.push_back(in_rows[r] * row);
  }
  FSDP_ASSERT(in.dim() >= 1 && out.dim() >= 1 && in.size(0) == in_total && out.size(0) == out_total && row == out_row,
              "all_to_all: ", in.sizes(), " in for ", in_total, " rows and ", out.sizes(), " out for ", out_total);
  const int64_t sent = sent_rows * row * static_cast<int64_t>(in.element_size());
  return issue(
      Collective::kAllToAll, label, {{"out", &out}, {"in", &in}}, nbytes(in), 0,
      [&] { return backend_->all_to_all(out.reshape({-1}), in.reshape({-1}), out_splits, in_splits, label); }, sent);
}

Work ProcessGroup::shift(const at::Tensor& out, const at::Tensor& in, int offset, const std::string& label) {
  FSDP_ASSERT(out.scalar_type() == in.scalar_type() && out.numel() == in.numel(), "shift: out and in differ");
  FSDP_ASSERT(!out.is_same(in), "shift: out and in must be distinct");
  const int w = size();
  const int to = ((rank() + offset) % w + w) % w, from = ((rank() - offset) % w + w) % w;
  return issue(Collective::kShift, label, {{"out", &out}, {"in", &in}}, nbytes(in), offset, [&] {
    std::vector<int64_t> out_splits(static_cast<size_t>(w), 0), in_splits(static_cast<size_t>(w), 0);
    out_splits[static_cast<size_t>(from)] = out.numel();
    in_splits[static_cast<size_t>(to)] = in.numel();
    return backend_->all_to_all(out.reshape({-1}), in.reshape({-1}), std::move(out_splits), std::move(in_splits),
                                label);
  });
}

at::Tensor ProcessGroup::all_gather_copies(const at::Tensor& mine, const std::string& label) {
  const int64_t n = mine.numel();
  if (size() == 1 || n == 0) return mine.reshape({-1});
  const std::optional<c10::DeviceType> type = backend_->device_type();
  const c10::Device via = !type ? mine.device()
                          : *type == c10::DeviceType::CUDA
                              ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(gpu_))
                              : c10::Device(*type);
  at::Tensor all = at::empty({size() * n}, mine.options().device(via).pinned_memory(false));
  at::Tensor in = all.narrow(0, rank() * n, n);
  in.copy_(mine.reshape({-1}));
  all_gather(all, in, label).wait();
  return all.to(mine.device());
}

ProcessGroup make_single_process_group() {
  return ProcessGroup(std::make_shared<LocalBackend>(), std::chrono::minutes(10));
}

namespace {

std::chrono::milliseconds timeout_of(const GroupOptions& options) {
  if (options.timeout) return *options.timeout;
  if (const std::optional<double> seconds = env_seconds(env::kDistTimeout))
    return std::chrono::milliseconds(static_cast<int64_t>(*seconds * 1000));
  return std::chrono::seconds(600);
}

// Where the world meets: the launcher's store (torchrun's "agent store"), else rank 0 serves one.
// A world of one on a GPU serves its own, on a free port of the loopback.
std::shared_ptr<Store> rendezvous(const WorkerContext& ctx, std::chrono::milliseconds timeout) {
  StoreOptions so;
  so.timeout = timeout;
  if (ctx.world_size == 1) {
    so.port = 0;
    so.is_server = true;
    so.loopback_only = true;
    return std::make_shared<Store>(so);
  }
  so.host = env_or("MASTER_ADDR", "127.0.0.1");
  so.port = env_port();
  const bool agent_store = env_or("TORCHELASTIC_USE_AGENT_STORE", "") == "True";
  so.is_server = !agent_store && ctx.rank == 0;
  so.loopback_only = so.host == "localhost" || so.host.rfind("127.", 0) == 0;  // every client is on this machine
  so.prefix = agent_store ? str("/worker/attempt_", env_or("TORCHELASTIC_RESTART_COUNT", "0"), "/") : "";
  return std::make_shared<Store>(so);
}

}  // namespace

ProcessGroup init_process_group(const GroupOptions& options) {
  const std::chrono::milliseconds timeout = timeout_of(options);
  const WorkerContext ctx = options.context ? *options.context : worker_context(options.backend == "gloo");
  const std::string backend = options.backend == "auto" ? ctx.backend : options.backend;
  FSDP_CHECK(backend == "gloo" || backend == "nccl", "[dist] unknown backend ", quoted(backend),
             "; expected gloo, nccl or auto");
  if (ctx.world_size == 1 && backend != "nccl") return make_single_process_group();
  auto store = rendezvous(ctx, timeout);
  std::shared_ptr<Backend> b = backend == "nccl"
                                   ? make_nccl_backend(*store, ctx.rank, ctx.world_size, ctx.gpu, timeout)
                                   : make_gloo_backend(store->with_prefix("gloo/"), ctx.rank, ctx.world_size, timeout);
  ProcessGroup group(std::move(b), timeout, std::move(store), ctx.gpu);
  if (options.debug.value_or(debug_requested())) group.enable_debug_checks();
  return group;
}

}  // namespace fsdp::dist

#include "dist/gloo/gloo_backend.h"

#include <ATen/ops/empty.h>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "dist/store_impl.h"
#include "dist/torch_compat.h"
#include "util/error.h"

namespace fsdp::dist {

namespace {

// A c10d work plus what must happen after it completes (copying a staged result back).
class GlooWork : public PendingWork {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> after)
      : work_(std::move(work)), after_(std::move(after)) {}

  bool wait(std::chrono::milliseconds timeout) override {
    const auto start = std::chrono::steady_clock::now();
    try {
      work_->wait(timeout);
    } catch (const std::exception& e) {
      // Gloo throws both for a timeout and for a peer that went away (its connection closed): only
      // the first takes the whole timeout.
      if (!work_->isCompleted() && std::chrono::steady_clock::now() - start >= timeout * 9 / 10) return false;
      throw Error(brief_message(e));
    }
    if (after_) after_();
    after_ = nullptr;
    return true;
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> after_;
};

class GlooBackend : public Backend {
 public:
  GlooBackend(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int rank, int size)
      : pg_(std::move(pg)), rank_(rank), size_(size) {}

  std::string name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::optional<c10::DeviceType> device_type() const override { return c10::DeviceType::CPU; }

  std::unique_ptr<PendingWork> all_gather(at::Tensor out, at::Tensor in, const std::string&) override {
    // Gloo moves bits: bf16 travels as fp16 (same width; Gloo has no bf16 type), nothing is converted.
    if (is_16bit_float(in)) {
      out = out.view(at::kHalf);
      in = in.view(at::kHalf);
    }
    return std::make_unique<GlooWork>(allgather_flat(*pg_, out, in), nullptr);
  }

  // Gloo's own reduce-scatter clones the whole input and all-reduces the clone; the input is scratch
  // here (Backend::reduce_scatter), so it is all-reduced in place and this rank's slice copied out:
  // no second full-size buffer, no page faults for one.
  std::unique_ptr<PendingWork> reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op, const std::string&) override {
    at::Tensor in_r = is_16bit_float(in) ? in.to(at::kFloat) : in;
    std::vector<at::Tensor> ts{in_r};
    const int64_t n = out.numel();
    return std::make_unique<GlooWork>(pg_->allreduce(ts, c10d::AllreduceOptions{c10d::ReduceOp(c10d::ReduceOp::SUM)}),
                                      [out, in_r, op, n, rank = rank_, size = size_] {
                                        at::Tensor mine = in_r.narrow(0, rank * n, n);
                                        if (op == ReduceOp::kAvg) mine.div_(size);
                                        out.copy_(mine);
                                      });
  }
  std::unique_ptr<PendingWork> all_reduce(at::Tensor tensor, ReduceOp op, const std::string&) override {
    at::Tensor t_r = is_16bit_float(tensor) ? tensor.to(at::kFloat) : tensor;
    std::vector<at::Tensor> ts{t_r};
    const auto how = op == ReduceOp::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    return finish_reduction(pg_->allreduce(ts, c10d::AllreduceOptions{c10d::ReduceOp(how)}), tensor, t_r, op);
  }

  std::unique_ptr<PendingWork> broadcast(at::Tensor tensor, int root, const std::string&) override {
    std::vector<at::Tensor> ts{is_16bit_float(tensor) ? tensor.view(at::kHalf) : tensor};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return std::make_unique<GlooWork>(pg_->broadcast(ts, o), nullptr);
  }

  std::unique_ptr<PendingWork> barrier(const std::string&) override {
    return std::make_unique<GlooWork>(pg_->barrier(), nullptr);
  }

  std::unique_ptr<PendingWork> all_to_all(at::Tensor out, at::Tensor in, std::vector<int64_t> out_splits,
                                          std::vector<int64_t> in_splits, const std::string&) override {
    if (is_16bit_float(in)) {  // bits moved, as all_gather's
      out = out.view(at::kHalf);
      in = in.view(at::kHalf);
    }
    c10d::AllToAllOptions o;
    return std::make_unique<GlooWork>(pg_->alltoall_base(out, in, out_splits, in_splits, o), nullptr);
  }

 private:
  static bool is_16bit_float(const at::Tensor& t) {
    return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
  }
  // Reductions of 16-bit floats run in fp32 (the sum of W values rounds once, at the end): the
  // buffer the collective writes, which is `t` itself for other dtypes.
  static at::Tensor reduction_buffer(const at::Tensor& t) {
    return is_16bit_float(t) ? at::empty(t.sizes(), t.options().dtype(at::kFloat)) : t;
  }

  // After the sum: the average divides by the group size, and a staged result is copied back.
  std::unique_ptr<PendingWork> finish_reduction(c10::intrusive_ptr<c10d::Work> work, at::Tensor result,
                                                at::Tensor reduced, ReduceOp op) {
    return std::make_unique<GlooWork>(std::move(work), [result, reduced, op, n = size_] {
      if (op == ReduceOp::kAvg) reduced.div_(n);
      if (!reduced.is_same(result)) result.copy_(reduced);
    });
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_, size_;
};

// GLOO_SOCKET_IFNAME (as in PyTorch) picks the interface; a loopback rendezvous stays on loopback;
// otherwise the address this machine's hostname resolves to.
std::shared_ptr<::gloo::transport::Device> make_device(const std::string& store_host) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (store_host == "localhost" || store_host.rfind("127.", 0) == 0)
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

std::shared_ptr<Backend> make_gloo_backend(const Store& store, int rank, int size, std::chrono::milliseconds timeout) {
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(make_device(store.options().host));
    options->threads = 2;
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store.impl().prefixed, rank, size, options);
    return std::make_shared<GlooBackend>(std::move(pg), rank, size);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(str("[dist] rank ", rank, " of ", size, " could not connect the Gloo group: ", brief_message(e),
                    "; a peer may have failed to start, or the machines cannot reach each other"));
  }
}

}  // namespace fsdp::dist

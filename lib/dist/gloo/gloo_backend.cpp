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
    try {
      work_->wait(timeout);
    } catch (const std::exception& e) {
      if (!work_->isCompleted()) return false;
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

  std::unique_ptr<PendingWork> all_gather(at::Tensor out, at::Tensor in) override {
    // Gloo moves bits: bf16 travels as fp16 (same width; Gloo has no bf16 type), nothing is converted.
    if (is_16bit_float(in)) {
      out = out.view(at::kHalf);
      in = in.view(at::kHalf);
    }
    return std::make_unique<GlooWork>(pg_->_allgather_base(out, in), nullptr);
  }

  std::unique_ptr<PendingWork> reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op) override {
    // Reduce 16-bit floats in fp32: the sum of W bf16 values rounds once, at the end.
    if (is_16bit_float(in)) {
      at::Tensor out32 = at::empty(out.sizes(), out.options().dtype(at::kFloat));
      at::Tensor in32 = in.to(at::kFloat);
      auto work = sum_scatter(out32, in32);
      return std::make_unique<GlooWork>(work, [out, out32, op, n = size_] {
        if (op == ReduceOp::kAvg) out32.div_(n);
        out.copy_(out32);
      });
    }
    auto work = sum_scatter(out, in);
    return std::make_unique<GlooWork>(work, [out, op, n = size_] {
      if (op == ReduceOp::kAvg) out.div_(n);
    });
  }

  std::unique_ptr<PendingWork> all_reduce(at::Tensor tensor, ReduceOp op) override {
    if (is_16bit_float(tensor)) {
      at::Tensor t32 = tensor.to(at::kFloat);
      std::vector<at::Tensor> ts{t32};
      auto work = pg_->allreduce(ts, c10d::AllreduceOptions{to_sum()});
      return std::make_unique<GlooWork>(work, [tensor, t32, op, n = size_] {
        if (op == ReduceOp::kAvg) t32.div_(n);
        tensor.copy_(t32);
      });
    }
    std::vector<at::Tensor> ts{tensor};
    auto work = pg_->allreduce(ts, c10d::AllreduceOptions{to_sum()});
    return std::make_unique<GlooWork>(work, [tensor, op, n = size_] {
      if (op == ReduceOp::kAvg) tensor.div_(n);
    });
  }

  std::unique_ptr<PendingWork> broadcast(at::Tensor tensor, int root) override {
    std::vector<at::Tensor> ts{is_16bit_float(tensor) ? tensor.view(at::kHalf) : tensor};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return std::make_unique<GlooWork>(pg_->broadcast(ts, o), nullptr);
  }

  std::unique_ptr<PendingWork> barrier() override { return std::make_unique<GlooWork>(pg_->barrier(), nullptr); }

 private:
  static bool is_16bit_float(const at::Tensor& t) {
    return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
  }
  static c10d::ReduceOp to_sum() { return c10d::ReduceOp(c10d::ReduceOp::SUM); }

  c10::intrusive_ptr<c10d::Work> sum_scatter(at::Tensor& out, at::Tensor& in) {
    c10d::ReduceScatterOptions o;
    o.reduceOp = to_sum();
    return pg_->_reduce_scatter_base(out, in, o);
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

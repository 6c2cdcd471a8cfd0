#include "dist/meta_group.h"

#include <chrono>
#include <memory>

#include "util/error.h"

namespace fsdp::dist {

namespace {

class MetaBackend : public Backend {
 public:
  MetaBackend(int rank, int size) : rank_(rank), size_(size) {}
  std::string name() const override { return "meta"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::optional<c10::DeviceType> device_type() const override { return std::nullopt; }
  std::unique_ptr<PendingWork> all_gather(at::Tensor, at::Tensor, const std::string&) override { return done(); }
  std::unique_ptr<PendingWork> reduce_scatter(at::Tensor, at::Tensor, ReduceOp, const std::string&) override {
    return done();
  }
  std::unique_ptr<PendingWork> all_reduce(at::Tensor, ReduceOp, const std::string&) override { return done(); }
  std::unique_ptr<PendingWork> broadcast(at::Tensor, int, const std::string&) override { return done(); }
  std::unique_ptr<PendingWork> barrier(const std::string&) override { return done(); }
  std::unique_ptr<PendingWork> all_to_all(at::Tensor, at::Tensor, std::vector<int64_t>, std::vector<int64_t>,
                                          const std::string&) override {
    return done();
  }

 private:
  static std::unique_ptr<PendingWork> done() { return std::make_unique<DoneWork>(); }
  int rank_, size_;
};

}  // namespace

ProcessGroup make_meta_group(int rank, int size) {
  FSDP_CHECK(size >= 1 && rank >= 0 && rank < size, "[dist] a meta group's rank ", rank, " of ", size);
  return ProcessGroup(std::make_shared<MetaBackend>(rank, size), std::chrono::minutes(10));
}

}  // namespace fsdp::dist

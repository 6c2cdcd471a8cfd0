#include "ckpt/checkpoint_stage.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "ckpt/file_system.h"
#include "util/error.h"

namespace fsdp::ckpt {

namespace {

// `count` floats of host memory for a save's copies on CPU, in 2 MiB pages where the kernel has them
// (MADV_HUGEPAGE): fewer faults as the copies first touch it, each of which leaves a virtual machine
// for its hypervisor. Not touched here: Staging fills it in (populate) piece by piece as it copies,
// so a writer can write the first pieces while the later ones are still being backed.
at::Tensor mapped_host_floats(int64_t count) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(float);
  const size_t mapped = bytes + kHuge;  // room to start on a 2 MiB boundary
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return at::empty({count}, at::kFloat);
  const auto start = (reinterpret_cast<uintptr_t>(base) + kHuge - 1) & ~uintptr_t{kHuge - 1};
  void* data = reinterpret_cast<void*>(start);
#ifdef MADV_HUGEPAGE
  ::madvise(data, bytes, MADV_HUGEPAGE);
#endif
  return at::from_blob(
      data, {count}, [base, mapped](void*) { ::munmap(base, mapped); }, at::TensorOptions().dtype(at::kFloat));
}

// Has the kernel back [p, p + n) of a mapping with memory in one call (MADV_POPULATE_WRITE, Linux
// 5.14), not a fault per page as a copy first touches it. A C program mapping and copying 0.65 GB on
// a 2-core virtual machine took 0.12 s so and 0.35-0.44 s faulting the pages in; memory its
// hypervisor has not backed yet costs more either way. Advice: where the kernel declines, the copy
// faults the pages in as before.
void populate(void* p, size_t n) {
  constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE, which older headers lack
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n + page - 1) & ~(page - 1);
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, kPopulateWrite);
}

}  // namespace

std::vector<at::Tensor> Staging::plan(const std::string& prefix, const std::vector<at::Tensor>& sources,
                                      const std::vector<uint64_t>& offsets, uint64_t bytes, const c10::Device& device) {
  const auto floats = static_cast<int64_t>(round_up_to_block(bytes) / 4);
  pinned_ = device.is_cuda();
  device_ = device;
  if (!buffer_.defined() || buffer_.numel() < floats) {
    buffer_ = at::Tensor();  // the old one goes first: both at once may not fit
    buffer_ = pinned_ ? at::empty({floats}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true))
                      : mapped_host_floats(floats);
    backed_ = pinned_ ? static_cast<uint64_t>(floats) * 4 : 0;
  }
  prefix_ = prefix;
  copies_.clear();
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < sources.size(); ++i) {
    const at::Tensor& t = sources[i];
    FSDP_ASSERT(offsets[i] % 4 == 0 && offsets[i] >= prefix.size(), "Staging: offset ", offsets[i]);
    at::Tensor dst = buffer_.narrow(0, static_cast<int64_t>(offsets[i] / 4), t.numel()).view(t.sizes());
    copies_.push_back({offsets[i], t, dst});
    out.push_back(dst);
  }
  std::sort(copies_.begin(), copies_.end(), [](const Copy& a, const Copy& b) { return a.offset < b.offset; });
  planned_ = true;
  const std::lock_guard<std::mutex> lock(mutex_);
  staged_ = 0;
  end_ = bytes;
  failed_ = false;
  copied_.reset();
  return out;
}

void Staging::copy() {
  if (!planned_) return;
  planned_ = false;
  try {
    char* base = static_cast<char*>(buffer_.data_ptr());
    std::memcpy(base, prefix_.data(), prefix_.size());
    if (!pinned_) publish(prefix_.size());
    constexpr int64_t kPiece = int64_t{32} << 20;
    for (const Copy& c : copies_) {
      const at::Tensor src = c.src.reshape({-1}), dst = c.dst.view({-1});
      for (int64_t at = 0; at < src.numel(); at += kPiece / 4) {
        const int64_t k = std::min(kPiece / 4, src.numel() - at);
        const uint64_t upto = c.offset + static_cast<uint64_t>(at + k) * 4;
        if (upto > backed_) {  // a piece ahead of the copy, in one call
          const uint64_t ahead = std::min<uint64_t>(static_cast<uint64_t>(buffer_.numel()) * 4, upto + kPiece);
          populate(base + backed_, ahead - backed_);
          backed_ = ahead;
        }
        dst.narrow(0, at, k).copy_(src.narrow(0, at, k), /*non_blocking=*/pinned_);
        if (!pinned_) publish(upto);
      }
    }
    if (pinned_) {  // before end_ is published: ready() reads it then
      copied_.emplace(device_.type());
      copied_->record(c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_));
    }
    publish(end_);
    copies_.clear();  // the sources are the model's: no reason to hold them here
  } catch (...) {
    const std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
    ready_.notify_all();
    throw;
  }
}

uint64_t Staging::back_all() {
  planned_ = false;
  copies_.clear();
  const auto size = static_cast<uint64_t>(buffer_.numel()) * 4;
  if (backed_ < size) populate(static_cast<char*>(buffer_.data_ptr()) + backed_, size - backed_);
  backed_ = size;
  return size;
}

double Staging::copied_at(Clock::time_point t0) {
  const std::lock_guard<std::mutex> lock(mutex_);
  return std::chrono::duration<double>(done_ - t0).count();
}

const char* Staging::ready(uint64_t upto) {
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait(lock, [&] { return failed_ || staged_ >= upto; });
  FSDP_CHECK(!failed_, "[ckpt] the copy of this rank's part to host memory failed; the save was abandoned");
  if (copied_) {
    copied_->synchronize();
    copied_.reset();
  }
  return static_cast<const char*>(buffer_.data_ptr());
}

void Staging::publish(uint64_t upto) {
  const std::lock_guard<std::mutex> lock(mutex_);
  staged_ = upto;
  if (upto == end_) done_ = Clock::now();
  ready_.notify_all();
}

void stage_shard_image(ShardImage& image, Staging& staging, const c10::Device& device) {
  std::vector<at::Tensor> sources;
  for (const HostRows& r : image.rows) sources.push_back(r.data);
  const std::vector<at::Tensor> staged =
      staging.plan(image.layout.header, sources, image.offsets, image.layout.size, device);
  for (size_t i = 0; i < image.rows.size(); ++i) image.rows[i].data = staged[i];
}

std::vector<HostSlice> stage_full_slices(FullSlices plan, Staging& staging, const c10::Device& device) {
  std::vector<at::Tensor> sources;
  for (const HostSlice& h : plan.slices) sources.push_back(h.slice);
  const std::vector<at::Tensor> staged = staging.plan("", sources, plan.offsets, plan.bytes, device);
  for (size_t i = 0; i < plan.slices.size(); ++i) plan.slices[i].slice = staged[i];
  return std::move(plan.slices);
}

}  // namespace fsdp::ckpt

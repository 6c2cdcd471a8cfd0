#include "fsdp/host_cache.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <unordered_map>

namespace fsdp {

namespace {

constexpr size_t kMinBytes = size_t{1} << 20;  // smaller blocks stay with the C allocator (its own bins)
constexpr size_t kPage = 4096;
// Free blocks kept at most: an eighth of the machine's memory, enough for every buffer a step of a
// large model frees and re-allocates; past it the largest free blocks go back first.
size_t max_cached_bytes() {
  static const size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) / 8 : size_t{1} << 30;
  }();
  return bytes;
}

// LibTorch's raw_allocate/raw_deallocate (used by some kernels) need a DataPtr whose context is
// its data pointer and one raw deleter for every block: so every block comes from alloc_cpu, the
// large ones are remembered by address, and release() caches those and frees the rest. A small
// tensor's own deleter is free_cpu.
class HostCache final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n < kMinBytes) {  // freed straight away: no lock, no lookup on the many small frees
      void* ptr = c10::alloc_cpu(n);
      return {ptr, ptr, &c10::free_cpu, c10::Device(c10::kCPU)};
    }
    const size_t bytes = (n + kPage - 1) / kPage * kPage;
    void* ptr = take(bytes);
    return {ptr, ptr, &HostCache::release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &HostCache::release; }
  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }

  HostCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  static HostCache& instance() {
    static HostCache* cache = new HostCache();  // never destroyed: tensors may outlive static teardown
    return *cache;
  }

 private:
  // The smallest free block of at least `bytes` if it is no more than an eighth larger, else a new one.
  void* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.lower_bound(bytes);
      if (it != free_.end() && it->first <= bytes + bytes / 8) {
        void* ptr = it->second;
        stats_.cached_bytes -= static_cast<int64_t>(it->first);
        free_.erase(it);
        ++stats_.reused;
        return ptr;
      }
      ++stats_.fresh;
    }
    void* ptr = c10::alloc_cpu(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    large_[ptr] = bytes;
    return ptr;
  }
  static void release(void* ptr) {
    if (!ptr) return;
    HostCache& self = instance();
    std::lock_guard<std::mutex> lock(self.mutex_);
    auto it = self.large_.find(ptr);
    if (it == self.large_.end()) {
      c10::free_cpu(ptr);
      return;
    }
    self.free_.emplace(it->second, ptr);
    self.stats_.cached_bytes += static_cast<int64_t>(it->second);
    while (static_cast<size_t>(self.stats_.cached_bytes) > max_cached_bytes()) {
      auto largest = std::prev(self.free_.end());
      self.stats_.cached_bytes -= static_cast<int64_t>(largest->first);
      self.large_.erase(largest->second);
      c10::free_cpu(largest->second);
      self.free_.erase(largest);
    }
  }

  std::mutex mutex_;
  std::unordered_map<void*, size_t> large_;  // every large block, in use or free: its rounded size
  std::multimap<size_t, void*> free_;        // the free ones, by size
  HostCacheStats stats_;
};

}  // namespace

void install_host_cache() {
  static const bool installed = [] {
    HostCache& cache = HostCache::instance();
    c10::SetCPUAllocator(&cache, /*priority=*/1);
    return true;
  }();
  (void)installed;
}

HostCacheStats host_cache_stats() {
  return HostCache::instance().stats();
}

}  // namespace fsdp

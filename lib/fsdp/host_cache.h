// A caching allocator for large host blocks: FSDP on the CPU frees and re-allocates the same big
// buffers every step (each unit's gathered parameters and gather output, the reduce-scatter input,
// the embedding's gradient), and the C allocator returns blocks that large to the kernel, so every
// step paid a page fault per 4 KiB of them again (about 2 GiB of fresh pages a step for the ~125M
// Llama, a fifth of the CPU time in the kernel). This keeps freed blocks of 1 MiB and more and hands
// them out again, the way the CUDA caching allocator does for device memory.
#pragma once

#include <cstdint>

namespace fsdp {

struct HostCacheStats {
  int64_t cached_bytes = 0;  // free blocks held for reuse
  int64_t reused = 0;        // allocations served from the cache
  int64_t fresh = 0;         // large allocations that went to the C allocator
};

// Makes the cache LibTorch's CPU allocator for tensors created from now on (idempotent). A tensor
// created before keeps the allocator it had. fully_shard installs it unless FsdpOptions::host_cache
// is false (engine.host_cache).
void install_host_cache();
HostCacheStats host_cache_stats();

}  // namespace fsdp

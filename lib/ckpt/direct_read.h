// Byte ranges of files read into host memory past the page cache (O_DIRECT), several requests in
// flight: how a resume reads a rank's rows of a checkpoint. The page cache would first allocate
// pages for every byte (host memory that grows with the checkpoint until the kernel reclaims it)
// and then copy them out; a single buffered or direct reader keeps one request in flight, where a
// disk (and the two readers of a 2-rank load) reaches its throughput with a few.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::ckpt {

struct RangeRead {
  std::string path;                 // the file
  uint64_t offset = 0, length = 0;  // its bytes [offset, offset + length)
  void* dest = nullptr;             // `length` bytes of host memory
  uint32_t crc = 0;                 // out: the CRC-32C of those bytes
  bool done = false;                // out: read (false: the file system refused O_DIRECT, or it is cached)
};

struct DirectReadOptions {
  // Requests in flight, and each one's size (a multiple of 4096). A 2-rank load of a 125M
  // checkpoint on a 2-core virtual machine filled each rank in 1.3 s with one request of 8 MiB,
  // 0.69-0.80 s with four, and 0.62-0.66 s with eight of 2 MiB (the two ranks' shares of the disk
  // even); its 0.5B checkpoint in 2.4-3.1 s with four of 8 MiB and 2.6-2.9 s with eight of 2 MiB.
  int threads = 8;
  uint64_t request_bytes = uint64_t{2} << 20;
  // Neighbouring ranges at most this far apart are read in one sweep (the bytes between them too).
  uint64_t merge_gap = uint64_t{1} << 20;
  // A file with at least this fraction of its pages already in the page cache is left to the
  // caller (done stays false): memory is faster than the disk.
  double cached_at_least = 0.5;
};

// Reads every range (in any order; ranges may overlap) and takes its CRC-32C. Ranges of a file the
// file system refuses O_DIRECT on, or whose pages are mostly cached, stay done = false for the
// caller to read another way. Host memory used: one request_bytes buffer per thread. Throws Error
// naming the file for a read that fails or ends early.
void read_ranges_direct(std::vector<RangeRead>& reads, const DirectReadOptions& options = {});

}  // namespace fsdp::ckpt

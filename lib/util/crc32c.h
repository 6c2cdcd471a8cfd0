// CRC-32C (Castagnoli), the checksum of checkpoint manifests and of token shards: the hardware
// instruction where the CPU has it (SSE 4.2), else a table. No state; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fsdp {

// crc32c(data, n, crc32c(a, k)) continues a running checksum.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The CRC-32C of A followed by B from crc32c(A) and crc32c(B) (B of `second_len` bytes), without
// reading either: so a file's checksum can be assembled from pieces read in any order.
uint32_t crc32c_join(uint32_t first, uint32_t second, uint64_t second_len);
// Of a whole file, read in blocks. Throws InputError naming the path when it cannot be read.
uint32_t crc32c_of_file(const std::string& path);
std::string crc_hex(uint32_t crc);  // 8 lowercase hex digits

}  // namespace fsdp

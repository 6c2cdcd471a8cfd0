// The llm.c token shard format: the one place it is defined, read and written.
//
//   shard.bin    a 256 x int32 header, then the tokens:
//                  header[0] magic: 20240520 (uint16 tokens) or 20240801 (uint32 tokens)
//                  header[1] version: 1 with the uint16 magic, 7 with the uint32 one (as llm.c
//                            writes them; anything else is refused)
//                  header[2] the number of tokens
//   shard.mask   optional, beside shard.bin (same name, .mask): one byte per token, bit 0
//                (kMaskTarget) set when the token is a target the loss counts (clear for a
//                prompt's), bit 1 (kMaskRecordStart) on the first token of each record (a
//                prompt/completion or chat record), which packing with document masks reads.
//                tokenize.json says mask_format 2; masks without it (format 1) have no bit 1
//
// A folder of shards, as `fsdptrain tokenize` and the data cache write it, is shard_000000.bin,
// shard_000001.bin, ... (each with its .mask when there are masks) and tokenize.json (data/corpus.h).
// Offsets are 64-bit: a shard may hold up to 2^31 - 1 tokens.
//
// Not thread-safe per object; a ShardReader may be read from several threads (pread, no state).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace fsdp::data {

inline constexpr int32_t kShardMagicUint16 = 20240520, kShardMagicUint32 = 20240801;
inline constexpr int32_t kShardVersionUint16 = 1, kShardVersionUint32 = 7;
inline constexpr int64_t kShardHeaderBytes = 256 * 4;
inline constexpr uint8_t kMaskTarget = 1, kMaskRecordStart = 2;
inline constexpr int kMaskFormat = 2;

// shard_N.bin -> shard_N.mask
std::string shard_mask_path(const std::string& bin_path);

// An open shard, its header checked against its size. Throws InputError naming the file for a
// wrong magic, a version that is not the magic's, a token count the size does not hold, and a
// mask of another length than the tokens.
class ShardReader {
 public:
  explicit ShardReader(const std::string& path);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t count() const { return count_; }
  int width() const { return width_; }  // bytes per token: 2 or 4
  bool has_mask() const { return mask_fd_ >= 0; }
  // Tokens [begin, begin + n) into out (ids as written: uint16 or uint32).
  void read(int64_t begin, int64_t n, int64_t* out) const;
  // Mask bytes [begin, begin + n) into out (kMaskTarget where there is no mask file).
  void read_mask(int64_t begin, int64_t n, uint8_t* out) const;

 private:
  std::string path_;
  int fd_ = -1, mask_fd_ = -1;
  int width_ = 2;
  int64_t count_ = 0;
};

// Writes shards under `dir`: shard_000000.bin, ... of up to `shard_tokens` tokens each, in
// `token_bytes` (2 or 4) per token, with a .mask beside each when `masks`. Each file is fsynced
// when it is full or at finish(). Throws InputError (`who` starts it) naming the file that cannot
// be written.
class ShardWriter {
 public:
  ShardWriter(std::string dir, int64_t shard_tokens, int token_bytes, bool masks, std::string who);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  // A document's ids; the first `uncounted` are not targets (a prompt's). With masks, its first
  // token is marked as a record's start.
  void add(const std::vector<int32_t>& ids, size_t uncounted);
  // The same with a byte per id: 1 when the loss counts it (a conversation's assistant turns).
  void add(const std::vector<int32_t>& ids, const std::vector<uint8_t>& counted);
  int64_t finish();  // closes the last shard; returns the number of shards
  // Every file written (name in the folder -> CRC-32C), for tokenize.json: readers verify them.
  const std::map<std::string, uint32_t>& checksums() const { return checksums_; }

 private:
  void write(std::FILE* f, const std::string& path, const void* p, size_t n) const;
  std::FILE* create(const std::string& path) const;
  void close(std::FILE*& f, const std::string& path);
  void open_next();
  void close_current();
  std::string dir_, who_, path_, mask_path_;
  int64_t limit_, count_ = 0, shards_ = 0;
  int width_;
  bool masks_;
  std::FILE* file_ = nullptr;
  std::FILE* mask_ = nullptr;
  std::map<std::string, uint32_t> checksums_;
};

// Checks each shard's file (and its mask) against the CRC-32C its folder's tokenize.json records,
// when it records one: a shard changed after it was made is refused, naming it, before training
// reads it. `checksums`: name in the folder -> CRC-32C.
void verify_shard(const std::string& bin_path, const std::map<std::string, uint32_t>& checksums);

// One shard from memory at `path` (uint16 when every id fits, else uint32): tests and tools.
void write_shard(const std::string& path, const std::vector<int32_t>& tokens);

}  // namespace fsdp::data

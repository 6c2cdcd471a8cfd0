// safetensors, exactly per the specification (huggingface/safetensors): 8-byte little-endian
// header length N, N bytes of JSON (right-padded with spaces to a multiple of 8), then the data
// buffer that the header's data_offsets index, with no holes, no overlaps and no trailing bytes.
//
// The reader enforces every rule of the reference reader and names the one a file breaks; it
// maps files into memory and never copies tensor bytes. The writer lays tensors out as the
// reference writer does (descending dtype alignment, then name) and always writes
// __metadata__ {"format": "pt"}, which transformers requires. No LibTorch here (see
// safetensors_torch.h), so the reader can be fuzzed on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/file_system.h"

namespace fsdp::ckpt {

enum class Dtype {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kC64,
  kF8_E5M2,
  kF8_E4M3,
  kF8_E8M0,
  kF8_E4M3FNUZ,
  kF8_E5M2FNUZ,
  kF4,
  kF6_E2M3,
  kF6_E3M2,
};

const char* dtype_name(Dtype d);  // "BF16", as written in files
std::optional<Dtype> dtype_from_name(const std::string& name);
int dtype_bits(Dtype d);                                    // 1..64 (F4: 4, F6_*: 6)
std::string shape_text(const std::vector<int64_t>& shape);  // "[2, 3]", for messages

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;   // [] is a scalar
  uint64_t begin = 0, end = 0;  // byte range in the data buffer
  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

struct Header {
  std::vector<TensorInfo> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + N
  const TensorInfo* find(const std::string& name) const;
};

// Validates a whole file's bytes (header and layout) and returns its header. Throws InputError
// "<where>: <reason>" for a malformed file: shorter than 8 bytes, header longer than 100,000,000
// bytes or past the end, not UTF-8/JSON, a tensor entry without dtype/shape/data_offsets or with
// an unknown dtype, a non-string metadata value, holes or overlaps between tensors, a byte count
// that does not match dtype x shape, trailing bytes.
Header parse_safetensors(const uint8_t* bytes, size_t size, const std::string& where);

// A memory-mapped safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws InputError naming the path
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  const Header& header() const { return header_; }
  const uint8_t* data(const TensorInfo& t) const { return base_ + header_.data_start + t.begin; }
  // The whole file as mapped.
  const uint8_t* mapped() const { return base_; }
  size_t size() const { return size_; }
  // Drops [p, p + n) (inside this file's mapping) from the process's resident pages once read: the
  // page cache keeps them, a later read maps them again. Reading a checkpoint tensor by tensor so
  // holds about one tensor resident, not the whole file.
  void release(const uint8_t* p, size_t n) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  Header header_;
};

// One tensor to write: its bytes, little-endian, row-major.
struct TensorBytes {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// The whole file as bytes (so callers can write it atomically). Throws InputError for a duplicate
// name or a byte count that does not match dtype x shape. metadata gets "format": "pt" unless set.
std::string serialize_safetensors(const std::vector<TensorBytes>& tensors,
                                  std::map<std::string, std::string> metadata = {});

// Where a safetensors file of these tensors (TensorBytes without data) puts everything: the header
// bytes (length prefix included), then each tensor's bytes in file order: its name, size and the
// offset they start at; size is the file's. SafetensorsWriter writes this layout; a FULL save's
// ranks each write their rows into it at those offsets.
struct SafetensorsLayout {
  std::string header;
  std::vector<std::string> order;
  std::vector<size_t> sizes;
  std::vector<uint64_t> offsets;
  uint64_t size = 0;
};
SafetensorsLayout safetensors_layout(const std::vector<TensorBytes>& specs,
                                     std::map<std::string, std::string> metadata = {});

// Writes a file one tensor at a time, so a writer never holds more than one tensor: the header
// comes from the specs (TensorBytes without data), then append() takes each tensor's bytes in
// order(), and finish() fsyncs and renames the temporary file into place. A writer destroyed
// before finish() removes its temporary file and leaves `path` untouched. Every byte goes through
// `fs` (ckpt/file_system.h), which keeps the file's size and CRC-32C.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, const std::vector<TensorBytes>& specs,
                    std::map<std::string, std::string> metadata = {}, FileSystem& fs = local_file_system());
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  const std::vector<std::string>& order() const { return order_; }
  // Where order()[i]'s bytes start in the file (8 + header length + its data offset).
  uint64_t file_offset(size_t i) const { return offsets_[i]; }
  void append(const std::string& name, const void* data, size_t nbytes);
  void finish();
  // After finish(): the file's size and CRC-32C.
  uint64_t bytes() const { return bytes_; }
  uint32_t checksum() const { return checksum_; }

 private:
  FileSystem& fs_;
  std::string path_, tmp_;
  std::unique_ptr<WritableFile> file_;
  std::vector<std::string> order_;
  std::vector<size_t> sizes_;
  std::vector<uint64_t> offsets_;
  size_t next_ = 0;
  uint64_t bytes_ = 0;
  uint32_t checksum_ = 0;
};

}  // namespace fsdp::ckpt

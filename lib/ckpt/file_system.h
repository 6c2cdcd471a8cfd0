// The file-system operations checkpoints are written with, behind an interface so tests can inject
// a failure (an I/O error, or the process dying) at any byte of a save and check that the previous
// checkpoint survives. Every byte written goes through a WritableFile, whose append and
// append_image also keep the file's CRC-32C, so a save knows each file's size and checksum without
// reading it back.
//
// Thread safety: a FileSystem is used from the checkpoint writer thread and the training thread;
// implementations must allow that (the local one holds no state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "util/crc32c.h"
#include "util/error.h"

namespace fsdp::ckpt {

using fsdp::crc32c;  // the manifests' checksum (util/crc32c.h)
using fsdp::crc32c_of_file;
using fsdp::crc_hex;

// A write that failed because the file system is full (ENOSPC, or EDQUOT: over a quota).
class DiskFullError : public Error {
 public:
  using Error::Error;
};

// What append_image needs of its buffer and writes it in units of: the largest logical block size
// of the disks O_DIRECT is used on.
constexpr size_t kDirectAlignment = 4096;
// `n` rounded up to a whole number of those blocks.
constexpr uint64_t round_up_to_block(uint64_t n) {
  return (n + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
}

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Throws Error naming the file and the OS reason (DiskFullError when the disk is full).
  virtual void append(const void* data, size_t n) = 0;
  virtual void sync() = 0;   // fsync
  virtual void close() = 0;  // after sync; the destructor closes an unclosed file
  // Positional writes, for a file several ranks fill at once (a FULL save's rows): `n` bytes at
  // `offset`, not counted in bytes() or checksum(). The whole blocks of a large write go past the
  // page cache where append_image's would; its partial first and last blocks, which a neighbouring
  // writer may share, through it. Errors as append's.
  virtual void write_at(uint64_t offset, const void* data, size_t n) = 0;
  virtual void resize(uint64_t size) = 0;  // the file's length (ftruncate): the rest reads as zeros
  // append() of a file's bytes from a buffer that starts on a kDirectAlignment boundary and has room
  // up to the next one past `n` (those bytes are written too, then cut off): straight from the
  // buffer to the disk where the file system allows it (O_DIRECT), not through the page cache, whose
  // pages a large save would otherwise allocate (and evict training's memory for) as it copies into
  // them. A file may be written so in pieces, each but the last a whole number of blocks, as they
  // become ready. Where the file system does not allow it, or the file's end is not on a block
  // boundary (or a file of under 1 MiB starts with it), as append(). Counted and checked as append.
  virtual void append_image(const void* data, size_t n) { append(data, n); }
  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }
  uint32_t checksum() const { return crc_; }

 protected:
  explicit WritableFile(std::string path) : path_(std::move(path)) {}
  void account(const void* data, size_t n) {
    crc_ = crc32c(data, n, crc_);
    bytes_ += n;
  }

 private:
  std::string path_;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates (truncating) a file for writing.
  virtual std::unique_ptr<WritableFile> create(const std::string& path) = 0;
  // Opens an existing file for write_at, keeping its contents.
  virtual std::unique_ptr<WritableFile> open_existing(const std::string& path) = 0;
  virtual void rename(const std::string& from, const std::string& to) = 0;
  virtual void sync_dir(const std::string& dir) = 0;  // makes renames and creations in `dir` durable
  virtual void make_dirs(const std::string& dir) = 0;
  virtual void remove_all(const std::string& path) = 0;  // rm -rf; no error when it does not exist
  // Entry names of a folder (not "." or ".."), sorted; empty when it does not exist.
  virtual std::vector<std::string> list(const std::string& dir) = 0;
  virtual bool exists(const std::string& path) = 0;
  // Bytes an unprivileged writer can still write on the file system holding `path` (or its
  // nearest existing parent).
  virtual uint64_t available_bytes(const std::string& path) = 0;
};

// The machine's own file system (POSIX calls). `direct` false: append_image and write_at never
// bypass the page cache.
FileSystem& local_file_system(bool direct = true);

// Writes `contents` to `path` through `fs` and fsyncs it; returns its checksum.
uint32_t write_whole_file(FileSystem& fs, const std::string& path, const std::string& contents);

}  // namespace fsdp::ckpt

#include "data/token_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/crc32c.h"
#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::data {

namespace {

void pread_all(int fd, uint8_t* out, size_t n, int64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + static_cast<int64_t>(done)));
    FSDP_CHECK(r > 0, "[data] cannot read ", path, ": ", r < 0 ? std::strerror(errno) : "the file got shorter");
    done += static_cast<size_t>(r);
  }
}

int open_or_throw(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(fd >= 0, "[data] cannot read ", quoted(path), ": ", std::strerror(errno));
  return fd;
}

}  // namespace

std::string shard_mask_path(const std::string& bin_path) {
  return (ends_with(bin_path, ".bin") ? bin_path.substr(0, bin_path.size() - 4) : bin_path) + ".mask";
}

ShardReader::ShardReader(const std::string& path) : path_(path) {
  fd_ = open_or_throw(path);
  struct stat st;
  FSDP_CHECK(::fstat(fd_, &st) == 0, "[data] cannot read ", quoted(path), ": ", std::strerror(errno));
  const int64_t bytes = st.st_size;
  FSDP_CHECK(bytes >= kShardHeaderBytes, "[data] ", path, ": ", bytes,
             " bytes is shorter than an llm.c header (1024); is it a token shard?");
  int32_t header[3];
  pread_all(fd_, reinterpret_cast<uint8_t*>(header), sizeof(header), 0, path);
  FSDP_CHECK(header[0] == kShardMagicUint16 || header[0] == kShardMagicUint32, "[data] ", path, ": magic ", header[0],
             " is not an llm.c token shard's (", kShardMagicUint16, " for uint16 tokens, ", kShardMagicUint32,
             " for uint32)");
  const bool narrow = header[0] == kShardMagicUint16;
  const int32_t version = narrow ? kShardVersionUint16 : kShardVersionUint32;
  FSDP_CHECK(header[1] == version, "[data] ", path, ": version ", header[1], " with magic ", header[0],
             "; llm.c writes version ", version,
             " there. The file was made by another tool or is damaged; make it "
             "again with fsdptrain tokenize");
  width_ = narrow ? 2 : 4;
  count_ = header[2];
  FSDP_CHECK(count_ >= 0 && bytes == kShardHeaderBytes + count_ * width_, "[data] ", path, ": the header says ", count_,
             " tokens of ", width_, " bytes, but the file has ", bytes - kShardHeaderBytes,
             " bytes after the header; the file is truncated or not a shard");
  const std::string mask = shard_mask_path(path);
  if (!file_exists(mask)) return;
  mask_fd_ = open_or_throw(mask);
  FSDP_CHECK(file_size(mask) == count_, "[data] ", mask, " has ", file_size(mask), " bytes but ", path, " has ", count_,
             " tokens: the mask is from another tokenization; tokenize the data again (fsdptrain "
             "tokenize) or delete the .mask files to train on every token");
}

ShardReader::~ShardReader() {
  if (fd_ >= 0) ::close(fd_);
  if (mask_fd_ >= 0) ::close(mask_fd_);
}

void ShardReader::read(int64_t begin, int64_t n, int64_t* out) const {
  thread_local std::vector<uint8_t> buf;
  buf.resize(static_cast<size_t>(n * width_));
  pread_all(fd_, buf.data(), buf.size(), kShardHeaderBytes + begin * width_, path_);
  for (int64_t i = 0; i < n; ++i) {
    if (width_ == 2) {
      uint16_t t;
      std::memcpy(&t, buf.data() + 2 * i, 2);
      out[i] = t;
    } else {
      uint32_t t;
      std::memcpy(&t, buf.data() + 4 * i, 4);
      out[i] = t;
    }
  }
}

void ShardReader::read_mask(int64_t begin, int64_t n, uint8_t* out) const {
  if (mask_fd_ < 0) {
    std::fill(out, out + n, kMaskTarget);
    return;
  }
  pread_all(mask_fd_, out, static_cast<size_t>(n), begin, shard_mask_path(path_));
}

ShardWriter::ShardWriter(std::string dir, int64_t shard_tokens, int token_bytes, bool masks, std::string who)
    : dir_(std::move(dir)), who_(std::move(who)), limit_(shard_tokens), width_(token_bytes), masks_(masks) {}

ShardWriter::~ShardWriter() {
  if (file_) std::fclose(file_);
  if (mask_) std::fclose(mask_);
}

void ShardWriter::add(const std::vector<int32_t>& ids, size_t uncounted) {
  std::vector<uint8_t> counted(ids.size(), 1);
  std::fill(counted.begin(), counted.begin() + static_cast<int64_t>(std::min(uncounted, ids.size())), 0);
  add(ids, counted);
}

void ShardWriter::add(const std::vector<int32_t>& ids, const std::vector<uint8_t>& counted) {
  for (size_t i = 0; i < ids.size();) {
    if (!file_ || count_ == limit_) open_next();
    const size_t n = std::min<size_t>(ids.size() - i, static_cast<size_t>(limit_ - count_));
    if (width_ == 2) {
      std::vector<uint16_t> narrow(ids.begin() + i, ids.begin() + i + n);
      write(file_, path_, narrow.data(), n * 2);
    } else {
      write(file_, path_, ids.data() + i, n * 4);
    }
    if (masks_) {
      std::vector<uint8_t> mask(n);
      for (size_t k = 0; k < n; ++k)
        mask[k] = static_cast<uint8_t>((counted[i + k] ? kMaskTarget : 0) | (i + k == 0 ? kMaskRecordStart : 0));
      write(mask_, mask_path_, mask.data(), n);
    }
    count_ += static_cast<int64_t>(n);
    i += n;
  }
}

int64_t ShardWriter::finish() {
  close_current();
  return shards_;
}

void ShardWriter::write(std::FILE* f, const std::string& path, const void* p, size_t n) const {
  FSDP_CHECK(std::fwrite(p, 1, n, f) == n, who_, " cannot write ", path, ": ", std::strerror(errno));
}

std::FILE* ShardWriter::create(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  FSDP_CHECK(f != nullptr, who_, " cannot create ", path, ": ", std::strerror(errno));
  return f;
}

void ShardWriter::close(std::FILE*& f, const std::string& path) {
  const bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  std::fclose(f);
  f = nullptr;
  FSDP_CHECK(ok, who_, " cannot write ", path, ": ", std::strerror(errno));
  checksums_[base_name(path)] = crc32c_of_file(path);
}

void ShardWriter::open_next() {
  close_current();
  char name[32];
  std::snprintf(name, sizeof(name), "/shard_%06lld", static_cast<long long>(shards_++));
  path_ = dir_ + name + ".bin";
  file_ = create(path_);
  const int32_t header[256] = {};  // the real one once the count is known (close_current)
  write(file_, path_, header, sizeof(header));
  if (masks_) mask_ = create(mask_path_ = shard_mask_path(path_));
  count_ = 0;
}

void ShardWriter::close_current() {
  if (mask_) close(mask_, mask_path_);
  if (!file_) return;
  const bool narrow = width_ == 2;
  const int32_t header[3] = {narrow ? kShardMagicUint16 : kShardMagicUint32,
                             narrow ? kShardVersionUint16 : kShardVersionUint32, static_cast<int32_t>(count_)};
  FSDP_CHECK(std::fseek(file_, 0, SEEK_SET) == 0, who_, " cannot write ", path_, ": ", std::strerror(errno));
  write(file_, path_, header, sizeof(header));
  close(file_, path_);
}

void verify_shard(const std::string& bin_path, const std::map<std::string, uint32_t>& checksums) {
  for (const std::string& path : {bin_path, shard_mask_path(bin_path)}) {
    const auto it = checksums.find(base_name(path));
    if (it == checksums.end() || !file_exists(path)) continue;
    const uint32_t crc = crc32c_of_file(path);
    FSDP_CHECK(crc == it->second, "[data] ", path, " has CRC-32C ", crc_hex(crc), " but ", parent_folder(path),
               "/tokenize.json records ", crc_hex(it->second),
               ": the file was changed after it was made. Tokenize the data again (for data.cache_dir, delete that "
               "folder and launch again)");
  }
}

void write_shard(const std::string& path, const std::vector<int32_t>& tokens) {
  const bool narrow = std::all_of(tokens.begin(), tokens.end(), [](int32_t t) { return t >= 0 && t < 65536; });
  std::vector<uint8_t> bytes(static_cast<size_t>(kShardHeaderBytes) + tokens.size() * (narrow ? 2 : 4));
  const int32_t header[3] = {narrow ? kShardMagicUint16 : kShardMagicUint32,
                             narrow ? kShardVersionUint16 : kShardVersionUint32, static_cast<int32_t>(tokens.size())};
  std::memcpy(bytes.data(), header, sizeof(header));
  uint8_t* at = bytes.data() + kShardHeaderBytes;
  for (int32_t t : tokens) {
    if (narrow) {
      const uint16_t v = static_cast<uint16_t>(t);
      std::memcpy(at, &v, 2);
      at += 2;
    } else {
      const uint32_t v = static_cast<uint32_t>(t);
      std::memcpy(at, &v, 4);
      at += 4;
    }
  }
  write_file_atomic(path, std::string(bytes.begin(), bytes.end()));
}

}  // namespace fsdp::data

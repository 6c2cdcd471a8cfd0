#include "ckpt/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp::ckpt {

namespace {

std::string os_error() {
  return std::strerror(errno);
}

class LocalFile final : public WritableFile {
 public:
  LocalFile(const std::string& path, bool existing, bool direct) : WritableFile(path), direct_fd_(direct ? -1 : -2) {
    fd_ = existing ? ::open(path.c_str(), O_WRONLY | O_CLOEXEC)
                   : ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(str("[ckpt] cannot ", existing ? "open " : "create ", quoted(path), ": ", os_error()));
  }
  ~LocalFile() override {
    if (fd_ >= 0) ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
  }
  void append(const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    size_t left = n;
    while (left > 0) {
      const ssize_t w = ::write(fd_, p, left);
      if (w < 0 && errno == EINTR) continue;
      fail_unless_written(w);
      p += w;
      left -= static_cast<size_t>(w);
    }
    account(data, n);
    start_writeback();
  }
  void append_image(const void* data, size_t n) override {
    const uint64_t at = bytes();
    const bool aligned = reinterpret_cast<uintptr_t>(data) % kDirectAlignment == 0 && at % kDirectAlignment == 0;
    if (!aligned || (at == 0 && n < kDirectBytesAtLeast) ||
        !write_direct(at, static_cast<const char*>(data), round_up_to_block(n), /*bounce=*/false))
      return append(data, n);
    resize(at + n);  // the padding of the last block off again
    if (::lseek(fd_, static_cast<off_t>(at + n), SEEK_SET) < 0) fail_unless_written(-1);
    account(data, n);
  }
  // A large piece's whole blocks go to the disk with O_DIRECT (straight from `data` when its address
  // and `offset` agree modulo the block, else copied through an aligned buffer), its partial first
  // and last blocks through the page cache: several ranks writing neighbouring pieces of one file
  // share only those blocks, and the page cache keeps each one whole.
  void write_at(uint64_t offset, const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    const uint64_t first = round_up_to_block(offset), last = (offset + n) / kDirectAlignment * kDirectAlignment;
    const bool bounce = (reinterpret_cast<uintptr_t>(p) - offset) % kDirectAlignment != 0;
    if (n >= kDirectBytesAtLeast && last > first && write_direct(first, p + (first - offset), last - first, bounce)) {
      write_buffered(offset, p, first - offset);
      write_buffered(last, p + (last - offset), offset + n - last);
      return;
    }
    write_buffered(offset, p, n);
  }
  void resize(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) fail_unless_written(-1);
  }
  void sync() override {
    if (::fsync(fd_) == 0) return;
    if (errno == ENOSPC || errno == EDQUOT)  // network file systems report a full disk here
      throw DiskFullError(str("[ckpt] cannot sync ", quoted(path()), ": ", os_error()));
    throw Error(str("[ckpt] cannot sync ", quoted(path()), ": ", os_error()));
  }
  void close() override {
    if (direct_fd_ >= 0) ::close(direct_fd_);  // sync() made its writes durable: nothing to report
    direct_fd_ = -2;
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw Error(str("[ckpt] cannot close ", quoted(path()), ": ", os_error()));
  }

 private:
  // Asks the kernel to start writing each 64 MiB written so far to the disk now, without waiting
  // (sync_file_range's WRITE: the pages are queued, not flushed and waited for): the disk works while
  // the next tensors are gathered and copied, and sync() at the end finds little left to write, where
  // it would otherwise flush the whole file after everything else was done. Advice: errors surface
  // in sync().
  void start_writeback() {
#ifdef __linux__
    constexpr uint64_t kWindow = uint64_t{64} << 20;
    if (bytes() - queued_ < kWindow) return;
    ::sync_file_range(fd_, static_cast<off64_t>(queued_), static_cast<off64_t>(bytes() - queued_),
                      SYNC_FILE_RANGE_WRITE);
    queued_ = bytes();
#endif
  }
  void write_buffered(uint64_t offset, const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      fail_unless_written(w);
      p += w;
      offset += static_cast<uint64_t>(w);
      n -= static_cast<size_t>(w);
    }
  }
  // Writes `n` bytes (whole blocks) at `offset` (a block boundary) with O_DIRECT through a second
  // descriptor of the file, in chunks of 64 MiB from `p` (aligned), or with `bounce` copied through
  // an aligned buffer of this file's first. False, with nothing written, when the file system
  // refuses O_DIRECT (tmpfs, some network and FUSE file systems: EINVAL at open or at the first
  // write), and for every later call on this file; errors after that throw as append's.
  bool write_direct(uint64_t offset, const char* p, size_t n, bool bounce) {
    if (direct_fd_ == -1) {
      direct_fd_ = ::open(path().c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
      if (direct_fd_ < 0) direct_fd_ = -2;
    }
    if (direct_fd_ < 0) return false;
    constexpr size_t kChunk = size_t{64} << 20, kBounce = size_t{16} << 20;
    if (bounce && !bounce_) bounce_.reset(static_cast<char*>(std::aligned_alloc(kDirectAlignment, kBounce)));
    const size_t step = bounce ? kBounce : kChunk;
    size_t done = 0;
    while (done < n) {
      const size_t k = std::min(step, n - done);
      if (bounce) std::memcpy(bounce_.get(), p + done, k);
      const ssize_t w = ::pwrite(direct_fd_, bounce ? bounce_.get() : p + done, k, static_cast<off_t>(offset + done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EINVAL && done == 0) {
        ::close(direct_fd_);
        direct_fd_ = -2;
        return false;
      }
      fail_unless_written(w);
      FSDP_CHECK(static_cast<size_t>(w) == k, "[ckpt] cannot write ", quoted(path()), ": a direct (O_DIRECT) write of ",
                 k, " bytes wrote ", w, "; set checkpoint.direct_io: false to write through the page cache");
      done += k;
    }
    return true;
  }
  // Below this, a file goes through the page cache: nothing to gain from O_DIRECT.
  static constexpr size_t kDirectBytesAtLeast = size_t{1} << 20;

  // A write call's result: nothing written is an error naming the file (a full disk as such).
  void fail_unless_written(ssize_t w) const {
    if (w > 0) return;
    if (w < 0 && (errno == ENOSPC || errno == EDQUOT))
      throw DiskFullError(str("[ckpt] cannot write ", quoted(path()), ": ", os_error()));
    throw Error(str("[ckpt] cannot write ", quoted(path()), ": ", w < 0 ? os_error() : "nothing was written"));
  }
  int fd_ = -1;
  int direct_fd_ = -1;  // with O_DIRECT: -1 not opened yet, -2 refused or not wanted
  std::unique_ptr<char, decltype(&std::free)> bounce_{nullptr, &std::free};
  uint64_t queued_ = 0;  // bytes queued for writeback so far
};

class LocalFileSystem final : public FileSystem {
 public:
  explicit LocalFileSystem(bool direct) : direct_(direct) {}
  std::unique_ptr<WritableFile> create(const std::string& path) override {
    return std::make_unique<LocalFile>(path, /*existing=*/false, direct_);
  }
  std::unique_ptr<WritableFile> open_existing(const std::string& path) override {
    return std::make_unique<LocalFile>(path, /*existing=*/true, direct_);
  }
  void rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      throw Error(str("[ckpt] cannot rename ", quoted(from), " to ", quoted(to), ": ", os_error()));
  }
  void sync_dir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw Error(str("[ckpt] cannot open folder ", quoted(dir), ": ", os_error()));
    const int rc = ::fsync(fd);
    ::close(fd);
    if (rc != 0) throw Error(str("[ckpt] cannot sync folder ", quoted(dir), ": ", os_error()));
  }
  void make_dirs(const std::string& dir) override { make_directories(dir); }
  void remove_all(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
      for (const std::string& e : list(path)) remove_all(path + "/" + e);
      if (::rmdir(path.c_str()) != 0) throw Error(str("[ckpt] cannot remove ", quoted(path), ": ", os_error()));
    } else if (::unlink(path.c_str()) != 0) {
      throw Error(str("[ckpt] cannot remove ", quoted(path), ": ", os_error()));
    }
  }
  std::vector<std::string> list(const std::string& dir) override {
    std::vector<std::string> out;
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return out;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    ::closedir(d);
    std::sort(out.begin(), out.end());
    return out;
  }
  bool exists(const std::string& path) override { return file_exists(path); }
  uint64_t available_bytes(const std::string& path) override {
    std::string p = path.empty() ? "." : path;
    struct statvfs st;
    while (::statvfs(p.c_str(), &st) != 0) {
      if (p == "/" || p == ".") return 0;
      p = parent_folder(p);
    }
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  }

 private:
  const bool direct_;
};

}  // namespace

FileSystem& local_file_system(bool direct) {
  static LocalFileSystem with(true), without(false);
  return direct ? with : without;
}

uint32_t write_whole_file(FileSystem& fs, const std::string& path, const std::string& contents) {
  auto f = fs.create(path);
  f->append(contents.data(), contents.size());
  f->sync();
  f->close();
  return f->checksum();
}

}  // namespace fsdp::ckpt

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

constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCastagnoliReflected : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

uint32_t crc_bytes(const uint8_t* p, size_t n, uint32_t state) {
  const auto& t = crc_table();
  for (size_t i = 0; i < n; ++i) state = t[(state ^ p[i]) & 0xFF] ^ (state >> 8);
  return state;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_hardware(const uint8_t* p, size_t n, uint32_t state) {
  uint64_t s = state;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    s = __builtin_ia32_crc32di(s, word);
  }
  uint32_t s32 = static_cast<uint32_t>(s);
  for (; n > 0; ++p, --n) s32 = __builtin_ia32_crc32qi(s32, *p);
  return s32;
}
#endif

std::string os_error() {
  return std::strerror(errno);
}

class LocalFile final : public WritableFile {
 public:
  explicit LocalFile(const std::string& path) : WritableFile(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(str("[ckpt] cannot create ", quoted(path), ": ", os_error()));
  }
  ~LocalFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  void append(const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    size_t left = n;
    while (left > 0) {
      const ssize_t w = ::write(fd_, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == ENOSPC || errno == EDQUOT))
        throw DiskFullError(str("[ckpt] cannot write ", quoted(path()), ": ", os_error()));
      if (w <= 0) throw Error(str("[ckpt] cannot write ", quoted(path()), ": ", os_error()));
      p += w;
      left -= static_cast<size_t>(w);
    }
    account(data, n);
  }
  void sync() override {
    if (::fsync(fd_) == 0) return;
    if (errno == ENOSPC || errno == EDQUOT)  // network file systems report a full disk here
      throw DiskFullError(str("[ckpt] cannot sync ", quoted(path()), ": ", os_error()));
    throw Error(str("[ckpt] cannot sync ", quoted(path()), ": ", os_error()));
  }
  void close() override {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw Error(str("[ckpt] cannot close ", quoted(path()), ": ", os_error()));
  }

 private:
  int fd_ = -1;
};

class LocalFileSystem final : public FileSystem {
 public:
  std::unique_ptr<WritableFile> create(const std::string& path) override { return std::make_unique<LocalFile>(path); }
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
};

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t state = ~crc;
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  state = hardware ? crc_hardware(p, n, state) : crc_bytes(p, n, state);
#else
  state = crc_bytes(p, n, state);
#endif
  return ~state;
}

uint32_t crc32c_of_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(fd >= 0, "[ckpt] cannot read ", quoted(path), ": ", os_error());
  std::vector<char> buf(size_t{8} << 20);
  uint32_t crc = 0;
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const std::string why = os_error();
      ::close(fd);
      throw InputError(str("[ckpt] cannot read ", quoted(path), ": ", why));
    }
    if (r == 0) break;
    crc = crc32c(buf.data(), static_cast<size_t>(r), crc);
  }
  ::close(fd);
  return crc;
}

std::string crc_hex(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", crc);
  return buf;
}

FileSystem& local_file_system() {
  static LocalFileSystem fs;
  return fs;
}

uint32_t write_whole_file(FileSystem& fs, const std::string& path, const std::string& contents) {
  auto f = fs.create(path);
  f->append(contents.data(), contents.size());
  f->sync();
  f->close();
  return f->checksum();
}

}  // namespace fsdp::ckpt

#include "util/crc32c.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "util/error.h"
#include "util/strings.h"

namespace fsdp {

namespace {

std::string os_error() {
  return std::strerror(errno);
}

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
  FSDP_CHECK(fd >= 0, "cannot read ", quoted(path), ": ", os_error());
  std::vector<char> buf(size_t{8} << 20);
  uint32_t crc = 0;
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const std::string why = os_error();
      ::close(fd);
      throw InputError(str("cannot read ", quoted(path), ": ", why));
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

}  // namespace fsdp

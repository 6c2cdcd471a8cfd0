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
// Three blocks of `len` bytes (a multiple of 8) at once: the crc32 instruction takes 3 cycles but
// starts one a cycle, so three independent chains run about three times as fast as one. Returns
// the three blocks' CRC-32C, each from a fresh start.
__attribute__((target("sse4.2"))) void crc_hardware3(const uint8_t* p, size_t len, uint32_t out[3]) {
  uint64_t a = 0xFFFFFFFFu, b = 0xFFFFFFFFu, c = 0xFFFFFFFFu;
  for (size_t i = 0; i < len; i += 8) {
    uint64_t wa, wb, wc;
    std::memcpy(&wa, p + i, 8);
    std::memcpy(&wb, p + len + i, 8);
    std::memcpy(&wc, p + 2 * len + i, 8);
    a = __builtin_ia32_crc32di(a, wa);
    b = __builtin_ia32_crc32di(b, wb);
    c = __builtin_ia32_crc32di(c, wc);
  }
  out[0] = ~static_cast<uint32_t>(a);
  out[1] = ~static_cast<uint32_t>(b);
  out[2] = ~static_cast<uint32_t>(c);
}
#endif

// Polynomial arithmetic modulo the (reflected) Castagnoli polynomial, for joining the CRCs of
// consecutive blocks: crc(A B) = crc(A) * x^(8 |B|) + crc(B).
uint32_t multiply_mod_p(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kCastagnoliReflected : b >> 1;
  }
  return product;
}

// x^(8 n) modulo the polynomial, by squaring (x^(2^k) for each bit k of 8 n).
uint32_t x_to_8n(uint64_t n) {
  static const std::array<uint32_t, 64> squares = [] {
    std::array<uint32_t, 64> t{};
    uint32_t x = 1u << 30;  // x^1 (reflected: x^0 is bit 31)
    for (uint32_t& e : t) {
      e = x;
      x = multiply_mod_p(x, x);
    }
    return t;
  }();
  uint32_t result = 1u << 31;  // x^0
  for (int k = 3; n != 0; n >>= 1, ++k)
    if (n & 1) result = multiply_mod_p(squares[static_cast<size_t>(k)], result);
  return result;
}

}  // namespace

uint32_t crc32c_join(uint32_t first, uint32_t second, uint64_t second_len) {
  return multiply_mod_p(x_to_8n(second_len), first) ^ second;
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  if (hardware && n >= (size_t{3} << 16)) {  // checkpoint files: three chains, joined
    const size_t len = n / 24 * 8;
    uint32_t parts[3];
    crc_hardware3(p, len, parts);
    crc = crc32c_join(crc, parts[0], len);
    crc = crc32c_join(crc, parts[1], len);
    crc = crc32c_join(crc, parts[2], len);
    p += 3 * len;
    n -= 3 * len;
  }
  uint32_t state = ~crc;
  state = hardware ? crc_hardware(p, n, state) : crc_bytes(p, n, state);
#else
  uint32_t state = ~crc;
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

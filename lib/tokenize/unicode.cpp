#include "tokenize/unicode.h"

#include <uninorm.h>

#include <array>
#include <cstdlib>
#include <map>

#include "util/error.h"

namespace fsdp::tokenize {

namespace {

// The length of the well-formed sequence at text[i] (Unicode Table 3-7), or 0 when ill-formed; for
// an ill-formed one, `maximal` is the length of its maximal subpart (at least 1).
size_t sequence_length(std::string_view t, size_t i, size_t& maximal) {
  const auto b = [&](size_t k) { return i + k < t.size() ? static_cast<uint8_t>(t[i + k]) : 0x100; };
  const unsigned c = b(0);
  maximal = 1;
  if (c < 0x80) return 1;
  unsigned lo = 0x80, hi = 0xBF;
  size_t n = 0;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    const unsigned x = b(k);
    const bool ok = k == 1 ? (x >= lo && x <= hi) : (x >= 0x80 && x <= 0xBF);
    if (!ok) {
      maximal = k;
      return 0;
    }
  }
  return n;
}

std::string encode_utf8(unsigned cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

struct ByteTable {
  std::array<std::string, 256> to_char;
  std::map<std::string, int, std::less<>> to_byte;
  ByteTable() {
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = encode_utf8(printable ? static_cast<unsigned>(b) : static_cast<unsigned>(next++));
      to_byte[to_char[b]] = b;
    }
  }
};

const ByteTable& table() {
  static const ByteTable t;
  return t;
}

}  // namespace

std::string repair_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t maximal = 1;
    const size_t n = sequence_length(text, i, maximal);
    if (n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += maximal;
    }
  }
  return out;
}

size_t first_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    size_t maximal = 1;
    const size_t n = sequence_length(text, i, maximal);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::vector<std::string_view> code_points(std::string_view text) {
  std::vector<std::string_view> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t maximal = 1;
    const size_t n = std::max<size_t>(1, sequence_length(text, i, maximal));
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

std::string normalize(std::string_view text, NormalForm form) {
  if (text.empty()) return "";
  uninorm_t nf = form == NormalForm::kNFC ? UNINORM_NFC : form == NormalForm::kNFKC ? UNINORM_NFKC
                 : form == NormalForm::kNFD ? UNINORM_NFD : UNINORM_NFKD;
  size_t length = 0;
  uint8_t* result = u8_normalize(nf, reinterpret_cast<const uint8_t*>(text.data()), text.size(), nullptr, &length);
  FSDP_ASSERT(result != nullptr, "u8_normalize failed");
  std::string out(reinterpret_cast<const char*>(result), length);
  std::free(result);
  return out;
}

const std::string& byte_to_char(uint8_t byte) {
  return table().to_char[byte];
}

int char_to_byte(std::string_view utf8_char) {
  const auto& m = table().to_byte;
  const auto it = m.find(utf8_char);
  return it == m.end() ? -1 : it->second;
}

}  // namespace fsdp::tokenize

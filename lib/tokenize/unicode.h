// Text helpers of the tokenizers: UTF-8 repair, code points, Unicode normalization (libunistring),
// and GPT-2's byte <-> character table of ByteLevel tokenizers. No state; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::tokenize {

// `text` with every ill-formed UTF-8 subpart replaced by U+FFFD, one per maximal subpart: what
// Python's bytes.decode("utf-8", errors="replace") gives, so the ids equal those of the Python
// `tokenizers` package reading the same file that way.
std::string repair_utf8(std::string_view text);
// The byte offset of the first ill-formed sequence; npos when `text` is valid UTF-8.
size_t first_invalid_utf8(std::string_view text);

// The UTF-8 sequences of `text`'s code points (valid UTF-8 required).
std::vector<std::string_view> code_points(std::string_view text);

enum class NormalForm { kNFC, kNFKC, kNFD, kNFKD };
std::string normalize(std::string_view text, NormalForm form);

// GPT-2's bytes_to_unicode: each byte's printable stand-in (UTF-8), and back (-1: not a stand-in).
const std::string& byte_to_char(uint8_t byte);
int char_to_byte(std::string_view utf8_char);

}  // namespace fsdp::tokenize

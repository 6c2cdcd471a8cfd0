#include "chat/jinja_unicode.h"

#include <algorithm>
#include <cstdint>

#include "chat/jinja_failure.h"

namespace fsdp::chat::jinja {
namespace {

struct CodeRange {
  uint32_t first, last;
};
// Code points first, first + stride, ..., last map to cp + delta.
struct CaseRun {
  uint32_t first, last;
  int32_t stride, delta;
};
// A mapping to more than one code point (UTF-8).
struct CaseSpecial {
  uint32_t cp;
  const char* utf8;
};

#include "chat/jinja_unicode_data.inc"

template <size_t N>
bool in_ranges(const CodeRange (&table)[N], char32_t cp) {
  const CodeRange* end = table + N;
  const CodeRange* it = std::upper_bound(table, end, cp, [](char32_t c, const CodeRange& r) { return c < r.first; });
  return it != table && cp <= (it - 1)->last;
}

bool is_cased(char32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  return in_ranges(kCased, cp);
}
bool is_lowercase(char32_t cp) {
  if (cp < 0x80) return cp >= 'a' && cp <= 'z';
  return in_ranges(kLowercase, cp);
}
bool is_uppercase(char32_t cp) {
  if (cp < 0x80) return cp >= 'A' && cp <= 'Z';
  return in_ranges(kUppercase, cp);
}

enum class Case { kUpper, kLower, kTitle };

// Appends the full case mapping of `cp` (one code point >= 0x80).
template <size_t R, size_t S>
void map_from_tables(const CaseRun (&runs)[R], const CaseSpecial (&special)[S], char32_t cp, std::string& out) {
  for (const CaseSpecial& s : special) {
    if (s.cp == cp) {
      out += s.utf8;
      return;
    }
  }
  const CaseRun* end = runs + R;
  const CaseRun* it = std::upper_bound(runs, end, cp, [](char32_t c, const CaseRun& r) { return c < r.first; });
  if (it != runs) {
    const CaseRun& r = *(it - 1);
    if (cp <= r.last && (cp - r.first) % r.stride == 0) {
      utf8_append(out, static_cast<char32_t>(static_cast<int64_t>(cp) + r.delta));
      return;
    }
  }
  utf8_append(out, cp);
}

void append_case(char32_t cp, Case c, std::string& out) {
  if (cp < 0x80) {
    char ch = static_cast<char>(cp);
    if (c == Case::kLower) {
      if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
    } else if (ch >= 'a' && ch <= 'z') {
      ch = static_cast<char>(ch - 'a' + 'A');
    }
    out += ch;
    return;
  }
  if (c == Case::kLower && cp == 0x3A3)
    throw Failure("lowercasing GREEK CAPITAL SIGMA (final sigma rule) is not supported");
  if (c == Case::kUpper) return map_from_tables(kUpperRuns, kUpperSpecial, cp, out);
  if (c == Case::kLower) return map_from_tables(kLowerRuns, kLowerSpecial, cp, out);
  map_from_tables(kTitleRuns, kTitleSpecial, cp, out);
}

std::string map_all(std::string_view s, Case c) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) append_case(utf8_next(s, &pos), c, out);
  return out;
}

}  // namespace

char32_t utf8_next(std::string_view s, size_t* pos) {
  const auto b0 = static_cast<unsigned char>(s[*pos]);
  if (b0 < 0x80) {
    ++*pos;
    return b0;
  }
  const int extra = b0 >= 0xF0 ? 3 : b0 >= 0xE0 ? 2 : 1;
  char32_t cp = b0 & (0x3F >> extra);
  for (int i = 1; i <= extra && *pos + i < s.size(); ++i)
    cp = (cp << 6) | (static_cast<unsigned char>(s[*pos + i]) & 0x3F);
  *pos += extra + 1;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

size_t utf8_offset(std::string_view s, size_t index) {
  size_t pos = 0;
  for (size_t i = 0; i < index && pos < s.size(); ++i) utf8_next(s, &pos);
  return pos;
}

size_t utf8_first_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    int extra;
    char32_t min;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      extra = 1, min = 0x80;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      extra = 2, min = 0x800;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      extra = 3, min = 0x10000;
    } else {
      return i;
    }
    if (i + extra >= s.size()) return i;
    char32_t cp = b0 & (0x3F >> extra);
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += extra + 1;
  }
  return std::string_view::npos;
}

bool py_isspace(char32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool py_isprintable(char32_t cp) {
  if (cp < 0x80) return cp >= 0x20 && cp < 0x7F;
  return !in_ranges(kNonPrintable, cp);
}

std::string py_upper(std::string_view s) {
  return map_all(s, Case::kUpper);
}
std::string py_lower(std::string_view s) {
  return map_all(s, Case::kLower);
}

std::string py_title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool previous_is_cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const char32_t cp = utf8_next(s, &pos);
    append_case(cp, previous_is_cased ? Case::kLower : Case::kTitle, out);
    previous_is_cased = is_cased(cp);
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const bool first = pos == 0;
    append_case(utf8_next(s, &pos), first ? Case::kTitle : Case::kLower, out);
  }
  return out;
}

std::string jinja_title(std::string_view s) {
  // re.split(r"([-\s({\[<]+)") keeps the separators; each non-empty piece is item[0].upper() +
  // item[1:].lower(), which leaves separator runs unchanged.
  std::string out;
  out.reserve(s.size());
  bool at_word_start = true;
  for (size_t pos = 0; pos < s.size();) {
    const char32_t cp = utf8_next(s, &pos);
    const bool separator = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_isspace(cp);
    if (separator) {
      utf8_append(out, cp);
      at_word_start = true;
      continue;
    }
    append_case(cp, at_word_start ? Case::kUpper : Case::kLower, out);
    at_word_start = false;
  }
  return out;
}

bool py_islower(std::string_view s) {
  bool cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const char32_t cp = utf8_next(s, &pos);
    if (is_uppercase(cp) || (is_cased(cp) && !is_lowercase(cp))) return false;
    cased = cased || is_lowercase(cp);
  }
  return cased;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t p = 0; p < s.size();) {
    const size_t at = p;
    const char32_t cp = utf8_next(s, &p);
    const bool brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
                     cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!brk) continue;
    if (cp == '\r' && p < s.size() && s[p] == '\n') ++p;
    out.emplace_back(s.substr(start, (keepends ? p : at) - start));
    start = p;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

bool py_isupper(std::string_view s) {
  bool cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const char32_t cp = utf8_next(s, &pos);
    if (is_lowercase(cp) || (is_cased(cp) && !is_uppercase(cp))) return false;
    cased = cased || is_uppercase(cp);
  }
  return cased;
}

}  // namespace fsdp::chat::jinja

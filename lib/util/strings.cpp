#include "util/strings.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <utility>

#include "util/error.h"

namespace fsdp {

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string to_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    parts.emplace_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::optional<long long> parse_int(std::string_view text) {
  std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno == 0 && end == s.c_str() + s.size()) return v;
  // Scientific notation with an integral value: 1e8, 1.0e+8.
  if (s.find_first_of("eE") == std::string::npos) return std::nullopt;
  auto d = parse_float(s);
  if (!d || !std::isfinite(*d) || std::floor(*d) != *d || std::fabs(*d) > 9.0e18) return std::nullopt;
  return static_cast<long long>(*d);
}

std::optional<double> parse_float(std::string_view text) {
  std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t subst = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, subst});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string lw = to_lower(word);
  std::optional<std::string> best;
  size_t best_d = std::max<size_t>(2, word.size() / 2) + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(lw, to_lower(c));
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != 0x7f) {
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out + "\"";
}

std::string excerpt(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return quoted(s);
  size_t cut = max_bytes;  // not inside a UTF-8 sequence
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return quoted(s.substr(0, cut)) + str("... (", s.size(), " bytes)");
}

long long parse_byte_size(const std::string& text, const std::string& what) {
  size_t digits = 0;
  while (digits < text.size() && ((text[digits] >= '0' && text[digits] <= '9') || text[digits] == '.')) ++digits;
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::pair<const char*, double> units[] = {
      {"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12}, {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  double v = 0;
  bool ok = digits > 0;
  if (ok) {
    try {
      v = std::stod(text.substr(0, digits));
    } catch (const std::exception&) {
      ok = false;
    }
  }
  for (const auto& [name, scale] : units)
    if (ok && unit == name && v > 0) return static_cast<long long>(v * scale);
  throw InputError(str(what, ": ", quoted(text), " is not a size; write it as 5GB, 500MB, 2GiB or a byte count"));
}

std::string format_bytes(long long bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (v == static_cast<double>(static_cast<long long>(v)))
    std::snprintf(buf, sizeof(buf), "%lld %s", static_cast<long long>(v), units[u]);
  else
    std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[u]);
  return buf;
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_of(" \t\n'\"\\$`!*?&;|<>(){}[]#~") == std::string::npos) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string plural(long long n, const std::string& singular, const std::string& several) {
  return str(n, " ", n == 1 ? singular : several.empty() ? singular + "s" : several);
}

std::string format_count(double n) {
  char buf[48];
  if (n >= 1e12)
    std::snprintf(buf, sizeof(buf), "%.3gT", n / 1e12);
  else if (n >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.2fB", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2fM", n / 1e6);
  else if (n >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.1fk", n / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f", n);
  return buf;
}

std::string format_seconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), seconds < 1 ? "%.2f s" : seconds < 100 ? "%.1f s" : "%.0f s", seconds);
  return buf;
}

}  // namespace fsdp

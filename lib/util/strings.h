// Small string helpers shared by the config loader, the CLI and the wizard.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp {

std::string to_lower(std::string_view s);
std::string to_upper(std::string_view s);
std::string trim(std::string_view s);
bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);
std::vector<std::string> split(std::string_view s, char sep);
std::string join(const std::vector<std::string>& parts, std::string_view sep);

// Parses a whole string as an integer; accepts scientific notation with an integral value
// ("1e8", "1.0e+8") because YAML 1.1 users write min_num_params that way.
std::optional<long long> parse_int(std::string_view s);
std::optional<double> parse_float(std::string_view s);

// Levenshtein distance, and the candidate closest to `word` when it is close enough to be a
// plausible typo (distance at most half the word's length, at least 2); nullopt otherwise.
size_t edit_distance(std::string_view a, std::string_view b);
std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates);

// A byte count for messages and tables: "512 B", "64 KiB", "1.5 MiB", "2 GiB".
std::string format_bytes(long long bytes);
// A word as a POSIX shell reads it back: as it is when safe, else in single quotes.
std::string shell_quote(const std::string& s);
// "1 rank", "2 ranks" (plural: the word for several, when not singular + "s").
std::string plural(long long n, const std::string& singular, const std::string& several = "");
// Seconds as people read them: "0.02 s", "2.7 s", "123 s".
std::string format_seconds(double seconds);
// A count for a rate or a size: "950", "12.3k", "2.01M", "8.03B", "4.12T".
std::string format_count(double n);
// "5GB" (decimal, as huggingface_hub's max_shard_size), "500MiB" (binary), "123" (bytes). Throws
// InputError naming `what` for anything else.
long long parse_byte_size(const std::string& text, const std::string& what);

// Double-quotes a string for messages: "maybe". Control characters (a terminal's escape sequences
// among them) are written as \n, \t, \r or \xHH, so a name read from a file cannot drive the
// terminal.
std::string quoted(std::string_view s);
// Exact matches, so that these win over std::quoted, which argument-dependent lookup also finds
// for a std::string or a C string where <iomanip> is included (and which escapes no control character).
inline std::string quoted(const std::string& s) {
  return quoted(std::string_view(s));
}
inline std::string quoted(const char* s) {
  return quoted(std::string_view(s));
}
// The same for text read from a file rather than written by the user: at most `max_bytes` of it,
// then "... (N bytes)".
std::string excerpt(std::string_view s, size_t max_bytes = 60);

}  // namespace fsdp

// A Unicode regular expression (PCRE2 with UTF and Unicode properties, JIT-compiled): what the
// Split pre-tokenizers of tokenizer.json need (\p{L}, \p{N}, case-insensitive groups, lookahead).
// Thread-safe for matching: each call uses its own match data.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdp::tokenize {

class Regex {
 public:
  // Throws InputError naming `where` and PCRE2's reason when `pattern` does not compile.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [begin, end) byte ranges of every non-empty, non-overlapping match in `text`, in order.
  // Throws InputError naming the pattern and the byte where matching gave up (PCRE2's match or
  // JIT stack limit: a pattern that backtracks catastrophically on this text; tokenizers fails too),
  // never a shorter list than the text has.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::tokenize

// A regular expression from a file or a config (a tokenizer.json's Split pattern, lora.target_modules,
// fsdp_ignored_modules): PCRE2 with UTF and Unicode properties, JIT-compiled where it can be, and
// bounded: a match gives up after kMatchLimit backtracking steps (with an error naming the pattern)
// instead of running for ever on a pattern such as (.*)*Z$, and PCRE2 refuses patterns nested deeper
// than its compile limit (250 groups) instead of recursing into a crash. std::regex has neither
// bound: it is not used.
// Thread-safe for matching: each call uses its own match data.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdp {

class Regex {
 public:
  // Backtracking steps a single match may take (PCRE2's match limit; its default is 10 million).
  static constexpr uint32_t kMatchLimit = 10'000'000;

  // Throws InputError naming `where` and PCRE2's reason when `pattern` does not compile.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [begin, end) byte ranges of every non-empty, non-overlapping match in `text`, in order.
  // Throws InputError naming the pattern and the byte where matching gave up (the match or JIT stack
  // limit: a pattern that backtracks catastrophically on this text; tokenizers fails too), never a
  // shorter list than the text has.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  // Whether the whole of `text` matches (Python's re.fullmatch, as PEFT reads target_modules).
  // Throws InputError naming the pattern when matching gives up.
  bool full_match(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp

// Reading JSON that fsdptrain did not write itself (tokenizer.json, config.json, indexes, manifests,
// JSONL records, metrics files): one bounded reader, so a hostile or broken file is an InputError
// naming it, never a crash. Nesting is checked on the text before anything is parsed (a file nested
// 100,000 levels deep cannot exhaust the stack), and parse errors name where, not the JSON
// library's internals. No state; thread-safe.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace fsdp {

// Deeper than any JSON a model, tokenizer or checkpoint holds (tokenizers' sequences nest a few levels).
inline constexpr size_t kMaxJsonDepth = 256;

// Parses `text`. Throws InputError "WHERE: not valid JSON: ..." or "WHERE: nested deeper than 256
// levels (at byte N)"; `where` names the file (and line).
nlohmann::json parse_json(std::string_view text, const std::string& where);
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& where);
// The same for a file; also throws naming it when it cannot be read.
nlohmann::json read_json_file(const std::string& path);
// For files that may be missing or foreign (a cache's own notes): nullopt instead of an error.
std::optional<nlohmann::json> try_read_json_file(const std::string& path);

// The byte offset where `text` first nests deeper than max_depth arrays and objects (strings and
// their escapes skipped); npos when it never does.
size_t too_deep_at(std::string_view text, size_t max_depth = kMaxJsonDepth);

}  // namespace fsdp

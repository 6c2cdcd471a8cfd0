// Reading JSON that fsdptrain did not write itself (tokenizer.json, config.json, indexes, manifests,
// JSONL records, metrics files): one bounded reader, so a hostile or broken file is an InputError
// naming it, never a crash. Nesting is checked on the text before anything is parsed (a file nested
// 100,000 levels deep cannot exhaust the stack), and parse errors name where, not the JSON
// library's internals. No state; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

// Fields of JSON read from a file, their type checked: a wrong or missing one is an InputError
// "WHERE: "KEY" is a number (7), where a string belongs", naming the file and the key, never the
// JSON library's words. `j` must be an object (json_object checks one). The _or forms give
// `fallback` for a key that is absent or null.
const nlohmann::json& json_object(const nlohmann::json& j, const std::string& where);
const nlohmann::json& json_field(const nlohmann::json& j, const std::string& key, const std::string& where);
std::string json_string(const nlohmann::json& j, const std::string& key, const std::string& where);
std::string json_string_or(const nlohmann::json& j, const std::string& key, const std::string& fallback,
                           const std::string& where);
int64_t json_int(const nlohmann::json& j, const std::string& key, const std::string& where);
double json_number_or(const nlohmann::json& j, const std::string& key, double fallback, const std::string& where);
bool json_bool_or(const nlohmann::json& j, const std::string& key, bool fallback, const std::string& where);
// A string or a list of strings (PEFT's target_modules); empty for absent or null.
std::vector<std::string> json_strings_or_empty(const nlohmann::json& j, const std::string& key,
                                               const std::string& where);
// The JSON library's message without its code ("[json.exception.type_error.302] type must be
// string, but is number" -> "a value has the wrong type: type must be string, but is number"), for
// a reader that names the file itself.
std::string json_error_words(const std::exception& e);
// What a JSON value is, for messages: "a number (7)", "a string (\"abc\")", "an object".
std::string json_kind(const nlohmann::json& v);

// The byte offset where `text` first nests deeper than max_depth arrays and objects (strings and
// their escapes skipped); npos when it never does.
size_t too_deep_at(std::string_view text, size_t max_depth = kMaxJsonDepth);

}  // namespace fsdp

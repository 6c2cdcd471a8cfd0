#include "util/json.h"

#include "util/error.h"
#include "util/files.h"
#include "util/strings.h"

namespace fsdp {

size_t too_deep_at(std::string_view text, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

namespace {

template <typename Json>
Json parse_bounded(std::string_view text, const std::string& where) {
  const size_t deep = too_deep_at(text);
  FSDP_CHECK(deep == std::string_view::npos, where, ": nested deeper than ", kMaxJsonDepth, " levels (at byte ", deep,
             "); no JSON fsdptrain reads nests that deep: the file is damaged or not what it should be");
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..." -> from "at".
    std::string why = e.what();
    const size_t at = why.find(" at ");
    throw InputError(str(where, ": not valid JSON:", at == std::string::npos ? " " + why : why.substr(at)));
  } catch (const nlohmann::json::out_of_range& e) {
    // "[json.exception.out_of_range.406] number overflow parsing '1e400'": where it is, not the library's code.
    std::string why = e.what();
    const size_t close = why.find("] ");
    throw InputError(str(where, ": ", close == std::string::npos ? why : why.substr(close + 2),
                         " (a number beyond double's range)"));
  }
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& where) {
  return parse_bounded<nlohmann::json>(text, where);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& where) {
  return parse_bounded<nlohmann::ordered_json>(text, where);
}

nlohmann::json read_json_file(const std::string& path) {
  return parse_json(read_file(path), path);
}

std::string json_error_words(const std::exception& e) {
  const std::string why = e.what();
  const size_t close = why.find("] ");
  if (why.rfind("[json.exception.", 0) != 0 || close == std::string::npos) return why;
  const std::string words = why.substr(close + 2);
  return why.find("type_error") != std::string::npos ? "a value has the wrong type: " + words : words;
}

std::string json_kind(const nlohmann::json& v) {
  const std::string text = v.is_structured() ? ""
                           : v.is_string()   ? " (" + excerpt(v.get<std::string>(), 40) + ")"
                                             : " (" + v.dump().substr(0, 40) + ")";
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "a list";
    case nlohmann::json::value_t::string:
      return "a string" + text;
    case nlohmann::json::value_t::boolean:
      return "a boolean" + text;
    case nlohmann::json::value_t::number_float:
      return "a number" + text;
    default:
      return "an integer" + text;
  }
}

namespace {

[[noreturn]] void wrong_kind(const nlohmann::json& v, const std::string& key, const char* wanted,
                             const std::string& where) {
  throw InputError(str(where, ": ", quoted(key), " is ", json_kind(v), ", where ", wanted, " belongs"));
}

// j[key] when present and not null, else nullptr.
const nlohmann::json* present(const nlohmann::json& j, const std::string& key, const std::string& where) {
  json_object(j, where);
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

const nlohmann::json& json_object(const nlohmann::json& j, const std::string& where) {
  FSDP_CHECK(j.is_object(), where, ": ", json_kind(j), ", where an object belongs");
  return j;
}

const nlohmann::json& json_field(const nlohmann::json& j, const std::string& key, const std::string& where) {
  const nlohmann::json* v = present(j, key, where);
  FSDP_CHECK(v != nullptr, where, ": ", quoted(key), " is missing");
  return *v;
}

std::string json_string(const nlohmann::json& j, const std::string& key, const std::string& where) {
  const nlohmann::json& v = json_field(j, key, where);
  if (!v.is_string()) wrong_kind(v, key, "a string", where);
  return v.get<std::string>();
}

std::string json_string_or(const nlohmann::json& j, const std::string& key, const std::string& fallback,
                           const std::string& where) {
  return present(j, key, where) ? json_string(j, key, where) : fallback;
}

int64_t json_int(const nlohmann::json& j, const std::string& key, const std::string& where) {
  const nlohmann::json& v = json_field(j, key, where);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {  // 8.0 is 8; 8.5 or 1e300 is no integer
    const double d = v.get<double>();
    if (d == static_cast<double>(static_cast<int64_t>(d)) && d > -9.2e18 && d < 9.2e18) return static_cast<int64_t>(d);
  }
  wrong_kind(v, key, "an integer", where);
}

double json_number_or(const nlohmann::json& j, const std::string& key, double fallback, const std::string& where) {
  const nlohmann::json* v = present(j, key, where);
  if (v == nullptr) return fallback;
  if (!v->is_number()) wrong_kind(*v, key, "a number", where);
  return v->get<double>();
}

bool json_bool_or(const nlohmann::json& j, const std::string& key, bool fallback, const std::string& where) {
  const nlohmann::json* v = present(j, key, where);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) wrong_kind(*v, key, "true or false", where);
  return v->get<bool>();
}

std::vector<std::string> json_strings_or_empty(const nlohmann::json& j, const std::string& key,
                                               const std::string& where) {
  const nlohmann::json* v = present(j, key, where);
  if (v == nullptr) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) wrong_kind(*v, key, "a string or a list of strings", where);
  std::vector<std::string> out;
  for (const nlohmann::json& x : *v) {
    if (!x.is_string()) wrong_kind(x, key + "[]", "a string", where);
    out.push_back(x.get<std::string>());
  }
  return out;
}

std::optional<nlohmann::json> try_read_json_file(const std::string& path) {
  if (!file_exists(path)) return std::nullopt;
  try {
    return read_json_file(path);
  } catch (const InputError&) {
    return std::nullopt;
  }
}

}  // namespace fsdp

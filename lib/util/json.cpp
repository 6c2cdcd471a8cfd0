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

std::optional<nlohmann::json> try_read_json_file(const std::string& path) {
  if (!file_exists(path)) return std::nullopt;
  try {
    return read_json_file(path);
  } catch (const InputError&) {
    return std::nullopt;
  }
}

}  // namespace fsdp

// JSON in (the render variables) and out (transformers' tojson filter: json.dumps).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "chat/jinja_unicode.h"
#include "chat/jinja_value.h"

namespace fsdp::chat::jinja {
namespace {

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const char32_t cp = utf8_next(s, &pos);
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
      if (cp > 0xFFFF) {
        const char32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      }
      out += buf;
    } else {
      out.append(s.substr(start, pos - start));
    }
  }
  out += '"';
}

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f < 0 ? "-Infinity" : "Infinity";
  return py_float_repr(f);
}

// json.dumps turns keys into strings: str as is, numbers as their repr, True -> "true".
std::string json_key(const Value& k) {
  switch (k.type()) {
    case Type::kString:
      return k.str();
    case Type::kBool:
      return k.as_bool() ? "true" : "false";
    case Type::kNone:
      return "null";
    case Type::kInt:
      return std::to_string(k.as_int());
    case Type::kFloat:
      return json_float(k.as_float());
    default:
      throw Failure("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonOptions& options) : opt_(options) {}

  void write(const Value& v, int level) {
    switch (v.type()) {
      case Type::kNone:
        out_ += "null";
        return;
      case Type::kBool:
        out_ += v.as_bool() ? "true" : "false";
        return;
      case Type::kInt:
        out_ += std::to_string(v.as_int());
        return;
      case Type::kFloat:
        out_ += json_float(v.as_float());
        return;
      case Type::kString:
        append_json_string(out_, v.str(), opt_.ensure_ascii);
        return;
      case Type::kDict:
        write_dict(v.dict(), level);
        return;
      case Type::kSeq:
        if (v.is_list_or_tuple()) {
          write_list(v.seq().items, level);
          return;
        }
        break;
      default:
        break;
    }
    throw Failure("Object of type " + type_name(v) + " is not JSON serializable");
  }

  std::string take() { return std::move(out_); }

 private:
  void newline(int level) {
    if (!opt_.has_indent) return;
    out_ += '\n';
    for (int i = 0; i < level; ++i) out_ += opt_.indent;
  }

  void write_list(const std::vector<Value>& items, int level) {
    if (items.empty()) {
      out_ += "[]";
      return;
    }
    out_ += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out_ += opt_.item_separator;
      newline(level + 1);
      write(items[i], level + 1);
    }
    newline(level);
    out_ += ']';
  }

  void write_dict(const DictObj& d, int level) {
    if (d.items.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> items;
    for (const auto& kv : d.items) items.push_back(&kv);
    if (opt_.sort_keys) {
      std::stable_sort(items.begin(), items.end(),
                       [](const auto* a, const auto* b) { return py_compare(a->first, b->first, "<") < 0; });
    }
    out_ += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out_ += opt_.item_separator;
      newline(level + 1);
      append_json_string(out_, json_key(items[i]->first), opt_.ensure_ascii);
      out_ += opt_.key_separator;
      write(items[i]->second, level + 1);
    }
    newline(level);
    out_ += '}';
  }

  const JsonOptions& opt_;
  std::string out_;
};

}  // namespace

Value from_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return Value::none();
    case Json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case Json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw Failure("integer " + std::to_string(u) + " does not fit 64 bits (not supported)");
      }
      return Value::integer(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float:
      return Value::floating(j.get<double>());
    case Json::value_t::string: {
      const auto& s = j.get_ref<const std::string&>();
      if (utf8_first_invalid(s) != std::string::npos) throw Failure("a variable holds text that is not valid UTF-8");
      return Value::string(s);
    }
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const Json& e : j) items.push_back(from_json(e));
      return Value::seq(std::move(items));
    }
    case Json::value_t::object: {
      DictObj d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (utf8_first_invalid(it.key()) != std::string::npos)
          throw Failure("a variable holds a key that is not valid UTF-8");
        d.items.emplace_back(Value::string(it.key()), from_json(it.value()));
      }
      return Value::dict(std::move(d));
    }
    default:
      throw Failure("unsupported JSON value (binary or discarded)");
  }
}

std::string to_json(const Value& v, const JsonOptions& options) {
  JsonWriter w(options);
  w.write(v, 0);
  return w.take();
}

}  // namespace fsdp::chat::jinja

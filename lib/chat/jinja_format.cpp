// Python's string formatting as templates use it: printf-style `fmt % args` (the % operator and
// the |format filter) and str.format. Conversions and specs beyond the common ones are refused.
#include <cmath>
#include <cstdio>

#include "chat/jinja_interp.h"
#include "chat/jinja_unicode.h"

namespace fsdp::chat::jinja {
namespace {

struct PrintfSpec {
  bool left = false, zero = false, plus = false, space = false;
  int width = -1, precision = -1;
  char conv = 0;
};

std::string pad(std::string s, const PrintfSpec& spec, bool numeric) {
  const auto len = static_cast<int>(utf8_length(s));
  if (spec.width <= len) return s;
  const int n = spec.width - len;
  if (spec.left) return s + std::string(n, ' ');
  if (spec.zero && numeric) {
    const size_t sign = !s.empty() && (s[0] == '-' || s[0] == '+' || s[0] == ' ') ? 1 : 0;
    return s.substr(0, sign) + std::string(n, '0') + s.substr(sign);
  }
  return std::string(n, ' ') + s;
}

std::string format_one(const PrintfSpec& spec, const Value& v) {
  switch (spec.conv) {
    case 's':
    case 'r': {
      std::string s = spec.conv == 's' ? py_str(v) : py_repr(v);
      if (spec.precision >= 0) s = s.substr(0, utf8_offset(s, static_cast<size_t>(spec.precision)));
      return pad(std::move(s), spec, false);
    }
    case 'd':
    case 'i':
    case 'f':
    case 'F': {
      if (!v.is_number())
        throw Failure(std::string("%") + spec.conv + " format: a real number is required, not " + type_name(v));
      char buf[512];
      const char* sign = spec.plus ? "+" : spec.space ? " " : "";
      if (spec.conv == 'd' || spec.conv == 'i') {
        const double d = v.number_as_double();
        if (v.type() == Type::kFloat && !std::isfinite(d))
          throw Failure("cannot convert float infinity or NaN to integer");
        const int64_t i = v.type() == Type::kFloat ? static_cast<int64_t>(d) : v.number_as_int();
        std::snprintf(buf, sizeof buf, "%s%lld", i < 0 ? "" : sign, static_cast<long long>(i));
      } else {
        std::snprintf(buf, sizeof buf, "%s%.*f", v.number_as_double() < 0 ? "" : sign,
                      spec.precision < 0 ? 6 : spec.precision, v.number_as_double());
      }
      return pad(buf, spec, true);
    }
    default:
      throw Failure(std::string("printf-style conversion '%") + spec.conv + "' is not supported");
  }
}

// Parses the spec after '%' at fmt[i]; returns the mapping key (if any) through `key`.
PrintfSpec parse_printf(const std::string& fmt, size_t* i, std::string* key) {
  PrintfSpec spec;
  if (*i < fmt.size() && fmt[*i] == '(') {
    const size_t close = fmt.find(')', *i);
    if (close == std::string::npos) throw Failure("incomplete format key");
    *key = fmt.substr(*i + 1, close - *i - 1);
    *i = close + 1;
  }
  for (; *i < fmt.size(); ++*i) {
    const char c = fmt[*i];
    if (c == '-') {
      spec.left = true;
    } else if (c == '0') {
      spec.zero = true;
    } else if (c == '+') {
      spec.plus = true;
    } else if (c == ' ') {
      spec.space = true;
    } else {
      break;
    }
  }
  auto number = [&]() {
    int n = 0;
    while (*i < fmt.size() && fmt[*i] >= '0' && fmt[*i] <= '9') n = n * 10 + (fmt[(*i)++] - '0');
    return n;
  };
  if (*i < fmt.size() && fmt[*i] == '*') throw Failure("'*' in printf-style formats is not supported");
  if (*i < fmt.size() && fmt[*i] >= '0' && fmt[*i] <= '9') spec.width = number();
  if (*i < fmt.size() && fmt[*i] == '.') {
    ++*i;
    spec.precision = number();
  }
  while (*i < fmt.size() && (fmt[*i] == 'h' || fmt[*i] == 'l' || fmt[*i] == 'L')) ++*i;
  if (*i >= fmt.size()) throw Failure("incomplete format");
  spec.conv = fmt[(*i)++];
  return spec;
}

// The value of one str.format field: "", "0", "name", then .attr and [key] parts (sandboxed).
Value format_field(Interp& interp, const std::string& field, const CallArgs& args, int* auto_index, bool* manual) {
  size_t end = field.find_first_of(".[");
  const std::string first = field.substr(0, end);
  Value v;
  const bool numbered = first.find_first_not_of("0123456789") == std::string::npos;  // "" too
  if (numbered && first.size() > 18) throw Failure("format field index " + first + " is too large (not supported)");
  if (numbered) {
    size_t index;
    if (first.empty()) {
      if (*manual) throw Failure("cannot switch from manual field specification to automatic field numbering");
      index = static_cast<size_t>((*auto_index)++);
    } else {
      if (*auto_index > 0) throw Failure("cannot switch from automatic field numbering to manual field specification");
      *manual = true;
      index = std::stoul(first);
    }
    if (index >= args.positional.size()) {
      throw Failure("Replacement index " + std::to_string(index) + " out of range for positional args tuple");
    }
    v = args.positional[index];
  } else {
    const Value* kw = nullptr;
    for (const auto& [k, value] : args.keyword) {
      if (k == first) kw = &value;
    }
    if (kw == nullptr) throw Failure("KeyError: " + py_repr_string(first));
    v = *kw;
  }
  while (end != std::string::npos && end < field.size()) {  // .attr and [key] parts, sandboxed
    if (field[end] == '.') {
      const size_t next = field.find_first_of(".[", end + 1);
      v = interp.get_attr(v, Value::string(field.substr(end + 1, next - end - 1)));
      end = next;
    } else {
      const size_t rb = field.find(']', end);
      if (rb == std::string::npos) throw Failure("Missing ']' in format string");
      const std::string key = field.substr(end + 1, rb - end - 1);
      const bool digits = !key.empty() && key.find_first_not_of("0123456789") == std::string::npos;
      if (digits && key.size() > 18) throw Failure("format field index " + key + " is too large (not supported)");
      v = interp.get_item(v, digits ? Value::integer(std::stoll(key)) : Value::string(key));
      end = rb + 1 < field.size() ? rb + 1 : std::string::npos;
    }
  }
  return v;
}

}  // namespace

std::string printf_format(const std::string& fmt, const std::vector<Value>& positional, const Value* mapping) {
  std::string out;
  size_t next_arg = 0;
  for (size_t i = 0; i < fmt.size();) {
    if (fmt[i] != '%') {
      out += fmt[i++];
      continue;
    }
    ++i;
    if (i < fmt.size() && fmt[i] == '%') {
      out += '%';
      ++i;
      continue;
    }
    std::string key;
    const PrintfSpec spec = parse_printf(fmt, &i, &key);
    if (!key.empty()) {
      if (mapping == nullptr) throw Failure("format requires a mapping");
      if (mapping->is_undefined()) fail_undefined(*mapping);
      if (!mapping->is_dict()) throw Failure(type_name(*mapping) + " indices must be integers or slices, not str");
      const Value* v = mapping->dict().find(std::string_view(key));
      if (v == nullptr) throw Failure("KeyError: " + py_repr_string(key));
      out += format_one(spec, *v);
      continue;
    }
    if (next_arg >= positional.size()) throw Failure("not enough arguments for format string");
    out += format_one(spec, positional[next_arg++]);
  }
  if (mapping == nullptr && next_arg < positional.size()) {
    throw Failure("not all arguments converted during string formatting");
  }
  return out;
}

std::string format_method(Interp& interp, const std::string& fmt, const CallArgs& args) {
  std::string out;
  int auto_index = 0;
  bool manual = false;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      throw Failure("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw Failure("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    const std::string whole = fmt.substr(i, close - i + 1);
    i = close;
    if (field.find('{') != std::string::npos) throw Failure("nested fields in str.format are not supported");
    char conversion = 0;
    const size_t colon = field.find(':');
    if (colon != std::string::npos) {
      if (colon + 1 < field.size()) throw Failure("format specs in str.format ('" + whole + "') are not supported");
      field.resize(colon);
    }
    const size_t bang = field.find('!');
    if (bang != std::string::npos) {
      if (bang + 2 != field.size() || (field[bang + 1] != 'r' && field[bang + 1] != 's')) {
        throw Failure("str.format conversion in '" + whole + "' is not supported");
      }
      conversion = field[bang + 1];
      field.resize(bang);
    }
    const Value v = format_field(interp, field, args, &auto_index, &manual);
    out += conversion == 'r' ? py_repr(v) : py_str(v);
  }
  return out;
}

}  // namespace fsdp::chat::jinja

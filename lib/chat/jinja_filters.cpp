// jinja2's built-in filters (jinja2/filters.py) as the sandboxed, non-autoescaping environment of
// transformers runs them, with transformers' own tojson.
// Generators stay generators (map, select, unique, items, ... : always true, no len(), used up by
// iterating), because templates can tell the difference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "chat/jinja_interp.h"
#include "chat/jinja_unicode.h"

namespace fsdp::chat::jinja {

enum class FilterId : uint8_t {
  kAbs,
  kAttr,
  kBatch,
  kCapitalize,
  kCenter,
  kLength,
  kDefault,
  kDictsort,
  kEscape,
  kFirst,
  kFloat,
  kForceescape,
  kFormat,
  kIndent,
  kInt,
  kJoin,
  kLast,
  kList,
  kLower,
  kItems,
  kMap,
  kMin,
  kMax,
  kReject,
  kRejectattr,
  kReplace,
  kReverse,
  kRound,
  kSafe,
  kSelect,
  kSelectattr,
  kSort,
  kString,
  kSum,
  kTitle,
  kTrim,
  kUnique,
  kUpper,
  kWordcount,
  kTojson,
  kUnsupported,
};

namespace {

struct FilterName {
  const char* name;
  FilterId id;
};
const FilterName kFilters[] = {
    {"abs", FilterId::kAbs},
    {"attr", FilterId::kAttr},
    {"batch", FilterId::kBatch},
    {"capitalize", FilterId::kCapitalize},
    {"center", FilterId::kCenter},
    {"count", FilterId::kLength},
    {"d", FilterId::kDefault},
    {"default", FilterId::kDefault},
    {"dictsort", FilterId::kDictsort},
    {"e", FilterId::kEscape},
    {"escape", FilterId::kEscape},
    {"first", FilterId::kFirst},
    {"float", FilterId::kFloat},
    {"forceescape", FilterId::kForceescape},
    {"format", FilterId::kFormat},
    {"indent", FilterId::kIndent},
    {"int", FilterId::kInt},
    {"join", FilterId::kJoin},
    {"last", FilterId::kLast},
    {"length", FilterId::kLength},
    {"list", FilterId::kList},
    {"lower", FilterId::kLower},
    {"items", FilterId::kItems},
    {"map", FilterId::kMap},
    {"min", FilterId::kMin},
    {"max", FilterId::kMax},
    {"reject", FilterId::kReject},
    {"rejectattr", FilterId::kRejectattr},
    {"replace", FilterId::kReplace},
    {"reverse", FilterId::kReverse},
    {"round", FilterId::kRound},
    {"safe", FilterId::kSafe},
    {"select", FilterId::kSelect},
    {"selectattr", FilterId::kSelectattr},
    {"sort", FilterId::kSort},
    {"string", FilterId::kString},
    {"sum", FilterId::kSum},
    {"title", FilterId::kTitle},
    {"trim", FilterId::kTrim},
    {"unique", FilterId::kUnique},
    {"upper", FilterId::kUpper},
    {"wordcount", FilterId::kWordcount},
    {"tojson", FilterId::kTojson},
    // jinja2 has these; the engine refuses them.
    {"filesizeformat", FilterId::kUnsupported},
    {"groupby", FilterId::kUnsupported},
    {"pprint", FilterId::kUnsupported},
    {"random", FilterId::kUnsupported},
    {"slice", FilterId::kUnsupported},
    {"striptags", FilterId::kUnsupported},
    {"truncate", FilterId::kUnsupported},
    {"urlencode", FilterId::kUnsupported},
    {"urlize", FilterId::kUnsupported},
    {"wordwrap", FilterId::kUnsupported},
    {"xmlattr", FilterId::kUnsupported},
};

Value gen(std::vector<Value> items) {
  return Value::seq(std::move(items), SeqKind::kGenerator);
}

Value run_filter(Interp& interp, FilterId id, const Value& v, const CallArgs& args);

// str(value) unless it is a str already (markup kept), as jinja2's soft_str.
Value soft_str(const Value& v) {
  return v.is_string() ? v : Value::string(py_str(v));
}

bool is_int_like(const Value& v) {
  return v.type() == Type::kInt || v.type() == Type::kBool;
}

int64_t int_arg(const Value& v, const char* what) {
  if (!is_int_like(v)) throw Failure(std::string(what) + " must be an integer, not " + type_name(v));
  return v.number_as_int();
}

// jinja2's make_attrgetter: "a.b.0" looked up part by part with the sandbox's getitem.
Value get_path(Interp& interp, Value item, const Value& attribute, const Value* fallback = nullptr) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    const std::string& a = attribute.str();
    size_t start = 0;
    while (true) {
      const size_t dot = a.find('.', start);
      const std::string part = a.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      if (digits && part.size() > 18) throw Failure("attribute index " + part + " is too large (not supported)");
      parts.push_back(digits ? Value::integer(std::stoll(part)) : Value::string(part));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  } else if (!attribute.is_none()) {
    parts.push_back(attribute);
  }
  for (const Value& part : parts) {
    item = interp.get_item(item, part);
    if (fallback != nullptr && !fallback->is_none() && item.is_undefined()) item = *fallback;
  }
  return item;
}

Value ignore_case(const Value& v) {
  return v.is_string() ? Value::string(py_lower(v.str())) : v;
}

// The key jinja2's sort, min, max, unique use: attribute lookup(s), lowercased unless case_sensitive.
Value sort_key(Interp& interp, const Value& item, const Value& attribute, bool case_sensitive, bool multi) {
  auto one = [&](const Value& attr) {
    Value k = get_path(interp, item, attr);
    return case_sensitive ? k : ignore_case(k);
  };
  if (!multi || !attribute.is_string() || attribute.str().find(',') == std::string::npos) {
    if (multi && attribute.is_string()) return Value::seq({one(attribute)});
    return one(attribute);
  }
  std::vector<Value> keys;
  const std::string& a = attribute.str();
  for (size_t start = 0;;) {
    const size_t comma = a.find(',', start);
    keys.push_back(one(Value::string(a.substr(start, comma == std::string::npos ? std::string::npos : comma - start))));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return Value::seq(std::move(keys));
}

std::vector<Value> to_vector(const Value& v) {
  const Items items = py_iter(v);
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) out.push_back(items[i]);
  return out;
}

Value filter_default(const Value& v, const CallArgs& args) {
  check_args(args, "default", 2, {"default_value", "boolean"});
  const Value fallback = arg_or(args, 0, "default_value", Value::string(""));
  const bool boolean = truthy(arg_or(args, 1, "boolean", Value::boolean(false)));
  return v.is_undefined() || (boolean && !truthy(v)) ? fallback : v;
}

Value filter_tojson(const Value& v, const CallArgs& args) {
  check_args(args, "tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = truthy(arg_or(args, 0, "ensure_ascii", Value::boolean(false)));
  const Value indent = arg_or(args, 1, "indent", Value::none());
  if (!indent.is_none()) {
    o.has_indent = true;
    if (indent.is_string()) {
      o.indent = indent.str();
    } else {
      o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, int_arg(indent, "indent"))), ' ');
    }
    o.item_separator = ",";
  }
  const Value seps = arg_or(args, 2, "separators", Value::none());
  if (!seps.is_none()) {
    const Items s = py_iter(seps);
    if (s.size() != 2 || !s[0].is_string() || !s[1].is_string()) throw Failure("separators must be two strings");
    o.item_separator = s[0].str();
    o.key_separator = s[1].str();
  }
  o.sort_keys = truthy(arg_or(args, 3, "sort_keys", Value::boolean(false)));
  return Value::string(to_json(v, o));
}

Value filter_join(Interp& interp, const Value& v, const CallArgs& args) {
  check_args(args, "join", 2, {"d", "attribute"});
  const std::string sep = py_str(arg_or(args, 0, "d", Value::string("")));
  const Value attribute = arg_or(args, 1, "attribute", Value::none());
  const Items items = py_iter(v);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    append_py_str(out, attribute.is_none() ? items[i] : get_path(interp, items[i], attribute));
  }
  return Value::string(std::move(out));
}

Value filter_indent(const Value& v, const CallArgs& args) {
  check_args(args, "indent", 3, {"width", "first", "blank"});
  if (!v.is_string()) throw Failure("the indent filter needs a string, not " + type_name(v));
  const Value width = arg_or(args, 0, "width", Value::integer(4));
  const std::string indention =
      width.is_string() ? width.str()
                        : std::string(static_cast<size_t>(std::max<int64_t>(0, int_arg(width, "width"))), ' ');
  const bool first = truthy(arg_or(args, 1, "first", Value::boolean(false)));
  const bool blank = truthy(arg_or(args, 2, "blank", Value::boolean(false)));
  const std::vector<std::string> lines = py_splitlines(v.str() + "\n", false);
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (i > 0) rv += "\n";
    if (i > 0 && (blank || !line.empty())) rv += indention;
    rv += line;
  }
  if (first) rv = indention + rv;
  return Value::string(std::move(rv), v.is_markup());
}

Value parse_py_float(const std::string& text, bool* ok) {
  std::string s;
  for (size_t p = 0; p < text.size();) {  // float() strips whitespace and allows '_' between digits
    const size_t start = p;
    if (!py_isspace(utf8_next(text, &p))) s.append(text, start, p - start);
  }
  std::string lower;
  for (char c : s) lower += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  std::string body = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  const bool neg = !lower.empty() && lower[0] == '-';
  *ok = true;
  if (body == "inf" || body == "infinity") return Value::floating(neg ? -INFINITY : INFINITY);
  if (body == "nan") return Value::floating(NAN);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && isdigit(static_cast<unsigned char>(s[i - 1])) &&
        isdigit(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    }
    if (std::strchr("0123456789+-.eE", s[i]) == nullptr) {
      *ok = false;
      return Value();
    }
    clean += s[i];
  }
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  *ok = !clean.empty() && end == clean.c_str() + clean.size() && clean.find_first_of("0123456789") != std::string::npos;
  return Value::floating(d);
}

Value filter_int(const Value& v, const CallArgs& args) {
  check_args(args, "int", 2, {"default", "base"});
  const Value fallback = arg_or(args, 0, "default", Value::integer(0));
  const int64_t base = int_arg(arg_or(args, 1, "base", Value::integer(10)), "base");
  if (v.is_undefined()) fail_undefined(v);
  if (is_int_like(v)) return Value::integer(v.number_as_int());
  if (v.type() == Type::kFloat) {
    const double d = v.as_float();
    if (std::isnan(d)) return fallback;
    if (std::isinf(d)) throw Failure("cannot convert float infinity to integer");
    if (std::fabs(d) >= 9.2e18) throw Failure("integer overflow (not supported)");
    return Value::integer(static_cast<int64_t>(d));
  }
  if (!v.is_string()) return fallback;
  std::string s;
  for (size_t p = 0; p < v.str().size();) {
    const size_t start = p;
    if (!py_isspace(utf8_next(v.str(), &p))) s.append(v.str(), start, p - start);
  }
  std::string digits;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && isalnum(static_cast<unsigned char>(s[i - 1])) &&
        isalnum(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    }
    digits += s[i];
  }
  if (base == 10 && !digits.empty() && digits.find_first_not_of("+-0123456789") == std::string::npos) {
    errno = 0;
    char* end = nullptr;
    const long long i = std::strtoll(digits.c_str(), &end, 10);
    if (errno == ERANGE) throw Failure("integer overflow (not supported)");
    if (end == digits.c_str() + digits.size()) return Value::integer(i);
  } else if (base != 10) {
    throw Failure("the int filter with a base other than 10 is not supported");
  }
  bool ok = false;
  const Value f = s.empty() ? Value() : parse_py_float(v.str(), &ok);
  if (!ok || std::isnan(f.as_float()) || std::isinf(f.as_float())) return fallback;
  if (std::fabs(f.as_float()) >= 9.2e18) throw Failure("integer overflow (not supported)");
  return Value::integer(static_cast<int64_t>(f.as_float()));
}

Value filter_float(const Value& v, const CallArgs& args) {
  check_args(args, "float", 1, {"default"});
  const Value fallback = arg_or(args, 0, "default", Value::floating(0.0));
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value::floating(v.number_as_double());
  if (!v.is_string()) return fallback;
  bool ok = false;
  Value f = parse_py_float(v.str(), &ok);
  return ok ? f : fallback;
}

Value filter_round(const Value& v, const CallArgs& args) {
  check_args(args, "round", 2, {"precision", "method"});
  const int64_t precision = int_arg(arg_or(args, 0, "precision", Value::integer(0)), "precision");
  const Value method = arg_or(args, 1, "method", Value::string("common"));
  const std::string m = method.is_string() ? method.str() : "";
  if (m != "common" && m != "ceil" && m != "floor") throw Failure("method must be common, ceil or floor");
  if (!v.is_number()) throw Failure("type " + type_name(v) + " doesn't define __round__ method");
  if (precision < 0 || precision > 300) throw Failure("round() with a negative or huge precision is not supported");
  if (m == "common") {
    if (v.type() != Type::kFloat) return Value::integer(v.number_as_int());
    const double d = v.as_float();
    if (!std::isfinite(d)) return v;
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), d);  // exact decimal rounding, as Python
    return Value::floating(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.number_as_double() * scale;
  if (!std::isfinite(x)) throw Failure("cannot convert float infinity to integer");
  return Value::floating((m == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

// select, reject, selectattr, rejectattr.
Value filter_select(Interp& interp, const Value& v, const CallArgs& args, bool by_attr, bool keep) {
  size_t off = 0;
  Value attribute;
  if (by_attr) {
    if (args.positional.empty()) throw Failure("Missing parameter for attribute name");
    attribute = args.positional[0];
    off = 1;
  }
  CallArgs test_args;
  test_args.keyword = args.keyword;
  TestId test{};
  const bool has_test = args.positional.size() > off;
  if (has_test) {
    const Value& name = args.positional[off];
    if (!name.is_string() || find_test(name.str(), &test) == Lookup::kUnknown)
      throw Failure("No test named " + py_repr(name));
    test_args.positional.assign(args.positional.begin() + static_cast<long>(off) + 1, args.positional.end());
  }
  std::vector<Value> out;
  if (truthy(v)) {
    const Items items = py_iter(v);
    for (size_t i = 0; i < items.size(); ++i) {
      const Value subject = by_attr ? get_path(interp, items[i], attribute) : items[i];
      const bool passed = has_test ? run_test(interp, test, subject, test_args) : truthy(subject);
      if (passed == keep) out.push_back(items[i]);
    }
  }
  return gen(std::move(out));
}

Value filter_map(Interp& interp, const Value& v, const CallArgs& args) {
  std::vector<Value> out;
  if (args.positional.empty()) {
    const Value* attribute = nullptr;
    Value fallback = Value::none();
    for (const auto& [k, value] : args.keyword) {
      if (k == "attribute") {
        attribute = &value;
      } else if (k == "default") {
        fallback = value;
      } else {
        throw Failure("Unexpected keyword argument " + py_repr_string(k));
      }
    }
    if (attribute == nullptr) throw Failure("map requires a filter argument");
    if (truthy(v)) {
      const Items items = py_iter(v);
      for (size_t i = 0; i < items.size(); ++i) out.push_back(get_path(interp, items[i], *attribute, &fallback));
    }
    return gen(std::move(out));
  }
  const Value& name = args.positional[0];
  FilterId id{};
  const Lookup found = name.is_string() ? find_filter(name.str(), &id) : Lookup::kUnknown;
  if (found == Lookup::kUnknown) throw Failure("No filter named " + py_repr(name) + ".");
  if (found == Lookup::kUnsupported) throw Failure("the filter " + py_repr(name) + " is not supported");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  if (truthy(v)) {
    const Items items = py_iter(v);
    for (size_t i = 0; i < items.size(); ++i) out.push_back(run_filter(interp, id, items[i], rest));
  }
  return gen(std::move(out));
}

Value filter_dictsort(const Value& v, const CallArgs& args) {
  check_args(args, "dictsort", 3, {"case_sensitive", "by", "reverse"});
  const bool case_sensitive = truthy(arg_or(args, 0, "case_sensitive", Value::boolean(false)));
  const Value by = arg_or(args, 1, "by", Value::string("key"));
  const bool reverse = truthy(arg_or(args, 2, "reverse", Value::boolean(false)));
  if (!by.is_string() || (by.str() != "key" && by.str() != "value")) {
    throw Failure("You can only sort by either \"key\" or \"value\"");
  }
  if (!v.is_dict()) throw Failure(py_repr_string(type_name(v)) + " object has no attribute 'items'");
  const size_t pos = by.str() == "key" ? 0 : 1;
  std::vector<std::pair<Value, Value>> keyed;  // (key, item)
  for (const auto& [k, value] : v.dict().items) {
    const Value& x = pos == 0 ? k : value;
    keyed.emplace_back(case_sensitive ? x : ignore_case(x), Value::seq({k, value}, SeqKind::kTuple));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? py_compare(b.first, a.first, "<") == -1 : py_compare(a.first, b.first, "<") == -1;
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::seq(std::move(out));
}

Value filter_first_last(const Value& v, bool first) {
  if (v.is_undefined())
    return Value::undefined_hint(first ? "No first item, sequence was empty." : "No last item, sequence was empty.");
  if (!first && (v.is_seq(SeqKind::kGenerator) || !(v.is_seq() || v.is_dict() || v.is_string()))) {
    throw Failure(py_repr_string(type_name(v)) + " object is not reversible");
  }
  if (first && v.is_seq(SeqKind::kGenerator)) {
    const SeqObj& g = v.seq();
    if (g.consumed >= g.items.size()) return Value::undefined_hint("No first item, sequence was empty.");
    return g.items[g.consumed++];
  }
  const Items items = py_iter(v);
  if (items.size() == 0) {
    return Value::undefined_hint(first ? "No first item, sequence was empty." : "No last item, sequence was empty.");
  }
  return first ? items[0] : items[items.size() - 1];
}

Value filter_min_max(Interp& interp, const Value& v, const CallArgs& args, bool is_min) {
  check_args(args, is_min ? "min" : "max", 2, {"case_sensitive", "attribute"});
  const bool case_sensitive = truthy(arg_or(args, 0, "case_sensitive", Value::boolean(false)));
  const Value attribute = arg_or(args, 1, "attribute", Value::none());
  const Items items = py_iter(v);
  if (items.size() == 0) return Value::undefined_hint("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(interp, items[0], attribute, case_sensitive, false);
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = sort_key(interp, items[i], attribute, case_sensitive, false);
    if (py_compare(key, best_key, is_min ? "<" : ">") == (is_min ? -1 : 1)) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}

Value filter_sort(Interp& interp, const Value& v, const CallArgs& args) {
  check_args(args, "sort", 3, {"reverse", "case_sensitive", "attribute"});
  const bool reverse = truthy(arg_or(args, 0, "reverse", Value::boolean(false)));
  const bool case_sensitive = truthy(arg_or(args, 1, "case_sensitive", Value::boolean(false)));
  const Value attribute = arg_or(args, 2, "attribute", Value::none());
  std::vector<std::pair<Value, Value>> keyed;
  const Items items = py_iter(v);
  for (size_t i = 0; i < items.size(); ++i) {
    keyed.emplace_back(sort_key(interp, items[i], attribute, case_sensitive, true), items[i]);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? py_compare(b.first, a.first, "<") == -1 : py_compare(a.first, b.first, "<") == -1;
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::seq(std::move(out));
}

Value filter_unique(Interp& interp, const Value& v, const CallArgs& args) {
  check_args(args, "unique", 2, {"case_sensitive", "attribute"});
  const bool case_sensitive = truthy(arg_or(args, 0, "case_sensitive", Value::boolean(false)));
  const Value attribute = arg_or(args, 1, "attribute", Value::none());
  std::vector<Value> seen, out;
  const Items items = py_iter(v);
  for (size_t i = 0; i < items.size(); ++i) {
    Value key = sort_key(interp, items[i], attribute, case_sensitive, false);
    if (!is_hashable(key)) throw Failure("unhashable type: " + py_repr_string(type_name(key)));
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, key); })) continue;
    seen.push_back(std::move(key));
    out.push_back(items[i]);
  }
  return gen(std::move(out));
}

Value filter_reverse(const Value& v) {
  if (v.is_string()) {
    if (v.is_markup()) throw Failure("|reverse on a |safe or |escape string is not supported");
    std::vector<std::string> chars;
    for (size_t p = 0; p < v.str().size();) {
      const size_t start = p;
      utf8_next(v.str(), &p);
      chars.push_back(v.str().substr(start, p - start));
    }
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
    return Value::string(std::move(out));
  }
  const bool generator = v.is_seq(SeqKind::kGenerator);
  if (!v.is_undefined() && !v.is_seq() && !v.is_dict()) throw Failure("argument must be iterable");
  std::vector<Value> items = to_vector(v);
  std::reverse(items.begin(), items.end());
  // reversed() gives an iterator; only a generator (not reversible) becomes a reversed list.
  return Value::seq(std::move(items), generator ? SeqKind::kList : SeqKind::kGenerator);
}

Value filter_batch(const Value& v, const CallArgs& args) {
  check_args(args, "batch", 2, {"linecount", "fill_with"});
  const Value* count = find_arg(args, 0, "linecount");
  if (count == nullptr) throw Failure("batch() missing required argument 'linecount'");
  const int64_t n = int_arg(*count, "linecount");
  const Value fill = arg_or(args, 1, "fill_with", Value::none());
  std::vector<Value> out, tmp;
  const Items items = py_iter(v);
  for (size_t i = 0; i < items.size(); ++i) {
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(Value::seq(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(items[i]);
  }
  if (!tmp.empty()) {
    if (!fill.is_none()) {
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(fill);
    }
    out.push_back(Value::seq(std::move(tmp)));
  }
  return gen(std::move(out));
}

Value filter_sum(Interp& interp, const Value& v, const CallArgs& args) {
  check_args(args, "sum", 2, {"attribute", "start"});
  const Value attribute = arg_or(args, 0, "attribute", Value::none());
  Value total = arg_or(args, 1, "start", Value::integer(0));
  if (total.is_string()) throw Failure("sum() can't sum strings [use ''.join(seq) instead]");
  const Items items = py_iter(v);
  for (size_t i = 0; i < items.size(); ++i) {
    total = binary_op(BinOp::kAdd, total, attribute.is_none() ? items[i] : get_path(interp, items[i], attribute));
  }
  return total;
}

Value filter_wordcount(const Value& v) {
  const Value s = soft_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (char c : s.str()) {
    if (static_cast<unsigned char>(c) >= 0x80) throw Failure("|wordcount on non-ASCII text is not supported");
    const bool w = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    n += w && !in_word;
    in_word = w;
  }
  return Value::integer(n);
}

Value filter_attr(const Value& v, const CallArgs& args) {
  check_args(args, "attr", 1, {"name"});
  const Value* name = find_arg(args, 0, "name");
  if (name == nullptr || !name->is_string()) throw Failure("attr() needs a name");
  if (v.is_undefined()) fail_undefined(v);
  if (v.type() == Type::kNamespace) {
    if (const Value* a = v.ns().attrs.find(std::string_view(name->str()))) return *a;
  } else if (name->str().rfind("_", 0) != 0) {
    bool found = false;
    Value a = builtin_attr(v, name->str(), &found);
    if (found) return a;
  }
  return Value::undefined_attr(v, *name);
}

Value filter_text(Interp& interp, FilterId id, const Value& v, const CallArgs& args) {
  const Value s = soft_str(v);
  const bool markup = s.is_markup();
  switch (id) {
    case FilterId::kUpper:
      check_args(args, "upper", 0, {});
      return Value::string(py_upper(s.str()), markup);
    case FilterId::kLower:
      check_args(args, "lower", 0, {});
      return Value::string(py_lower(s.str()), markup);
    case FilterId::kCapitalize:
      check_args(args, "capitalize", 0, {});
      return Value::string(py_capitalize(s.str()), markup);
    case FilterId::kTitle:
      check_args(args, "title", 0, {});
      return Value::string(jinja_title(s.str()));
    case FilterId::kTrim: {
      check_args(args, "trim", 1, {"chars"});
      CallArgs strip_args;
      if (const Value* chars = find_arg(args, 0, "chars")) strip_args.positional.push_back(*chars);
      return Value::string(call_method(interp, Value::string(s.str()), "strip", strip_args).str(), markup);
    }
    case FilterId::kCenter: {
      check_args(args, "center", 1, {"width"});
      CallArgs center_args;
      center_args.positional.push_back(arg_or(args, 0, "width", Value::integer(80)));
      return call_method(interp, s, "center", center_args);
    }
    case FilterId::kReplace: {
      check_args(args, "replace", 3, {"old", "new", "count"});
      const Value* old_v = find_arg(args, 0, "old");
      const Value* new_v = find_arg(args, 1, "new");
      if (old_v == nullptr || new_v == nullptr) throw Failure("replace() needs old and new");
      CallArgs r;
      r.positional = {Value::string(py_str(*old_v)), Value::string(py_str(*new_v))};
      const Value count = arg_or(args, 2, "count", Value::none());
      if (!count.is_none()) r.positional.push_back(count);
      return call_method(interp, Value::string(py_str(v)), "replace", r);
    }
    default:  // |format: soft_str(value) % args
      return Value::string(printf_format(s.str(), args.positional, nullptr));
  }
}

Value filter_format_kwargs(const Value& v, const CallArgs& args) {
  if (!args.positional.empty()) throw Failure("can't handle positional and keyword arguments at the same time");
  DictObj d;
  for (const auto& [k, value] : args.keyword) d.set(Value::string(k), value);
  const Value mapping = Value::dict(std::move(d));
  return Value::string(printf_format(soft_str(v).str(), {mapping}, &mapping));
}

Value filter_abs(const Value& v, const CallArgs& args) {
  check_args(args, "abs", 0, {});
  if (!v.is_number()) throw Failure("bad operand type for abs(): " + py_repr_string(type_name(v)));
  if (v.type() == Type::kFloat) return Value::floating(std::fabs(v.as_float()));
  if (v.number_as_int() == INT64_MIN) throw Failure("integer overflow (not supported)");
  return Value::integer(std::llabs(v.number_as_int()));
}

Value filter_items(const Value& v, const CallArgs& args) {
  check_args(args, "items", 0, {});
  if (v.is_undefined()) return gen({});
  if (!v.is_dict()) throw Failure("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, value] : v.dict().items) out.push_back(Value::seq({k, value}, SeqKind::kTuple));
  return gen(std::move(out));
}

// escape, forceescape, safe: markupsafe.Markup values (printing is the same; `+` escapes the other side).
Value filter_markup(FilterId id, const Value& v, const CallArgs& args) {
  check_args(args, "escape", 0, {});
  if (id == FilterId::kSafe) return v.is_markup() ? v : Value::string(py_str(v), true);
  if (id == FilterId::kEscape && v.is_markup()) return v;
  return Value::string(html_escape(py_str(v)), true);
}

Value run_filter(Interp& interp, FilterId id, const Value& v, const CallArgs& args) {
  if (v.is_markup() && (id == FilterId::kReverse || id == FilterId::kCenter || id == FilterId::kFormat)) {
    throw Failure("this filter on a |safe or |escape string is not supported");
  }
  switch (id) {
    case FilterId::kAbs:
      return filter_abs(v, args);
    case FilterId::kAttr:
      return filter_attr(v, args);
    case FilterId::kBatch:
      return filter_batch(v, args);
    case FilterId::kLength:
      check_args(args, "length", 0, {});
      return Value::integer(py_len(v));
    case FilterId::kDefault:
      return filter_default(v, args);
    case FilterId::kDictsort:
      return filter_dictsort(v, args);
    case FilterId::kEscape:
    case FilterId::kForceescape:
    case FilterId::kSafe:
      return filter_markup(id, v, args);
    case FilterId::kFirst:
    case FilterId::kLast:
      check_args(args, "first", 0, {});
      return filter_first_last(v, id == FilterId::kFirst);
    case FilterId::kFloat:
      return filter_float(v, args);
    case FilterId::kInt:
      return filter_int(v, args);
    case FilterId::kIndent:
      return filter_indent(v, args);
    case FilterId::kJoin:
      return filter_join(interp, v, args);
    case FilterId::kList:
      check_args(args, "list", 0, {});
      return Value::seq(to_vector(v));
    case FilterId::kItems:
      return filter_items(v, args);
    case FilterId::kMap:
      return filter_map(interp, v, args);
    case FilterId::kMin:
    case FilterId::kMax:
      return filter_min_max(interp, v, args, id == FilterId::kMin);
    case FilterId::kSelect:
    case FilterId::kReject:
      return filter_select(interp, v, args, false, id == FilterId::kSelect);
    case FilterId::kSelectattr:
    case FilterId::kRejectattr:
      return filter_select(interp, v, args, true, id == FilterId::kSelectattr);
    case FilterId::kReverse:
      check_args(args, "reverse", 0, {});
      return filter_reverse(v);
    case FilterId::kRound:
      return filter_round(v, args);
    case FilterId::kSort:
      return filter_sort(interp, v, args);
    case FilterId::kString:
      check_args(args, "string", 0, {});
      return soft_str(v);
    case FilterId::kSum:
      return filter_sum(interp, v, args);
    case FilterId::kUnique:
      return filter_unique(interp, v, args);
    case FilterId::kWordcount:
      check_args(args, "wordcount", 0, {});
      return filter_wordcount(v);
    case FilterId::kTojson:
      return filter_tojson(v, args);
    case FilterId::kFormat:
      if (!args.keyword.empty()) return filter_format_kwargs(v, args);
      return filter_text(interp, id, v, args);
    case FilterId::kUnsupported:
      throw Failure("unsupported filter");
    default:
      return filter_text(interp, id, v, args);
  }
}

}  // namespace

Lookup find_filter(std::string_view name, FilterId* id) {
  for (const FilterName& f : kFilters) {
    if (name == f.name) {
      *id = f.id;
      return f.id == FilterId::kUnsupported ? Lookup::kUnsupported : Lookup::kSupported;
    }
  }
  return Lookup::kUnknown;
}

Value apply_filter(Interp& interp, const Expr& filter, Value input) {
  const CallArgs args = interp.eval_args(filter);
  if (filter.lookup == Lookup::kUnknown) throw Failure("No filter named '" + filter.name + "' found.");
  if (filter.lookup == Lookup::kUnsupported) throw Failure("the filter '" + filter.name + "' is not supported");
  return run_filter(interp, filter.filter, input, args);
}

}  // namespace fsdp::chat::jinja

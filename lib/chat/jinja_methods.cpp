// Attributes and methods of Python's str, dict, list and tuple, jinja2's loop object, and the
// globals of transformers' environment. Methods the sandbox forbids (list.append, dict.update,
// ...) come back as an Undefined that raises SecurityError when called, as in jinja2.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>

#include "chat/jinja_interp.h"
#include "chat/jinja_unicode.h"

namespace fsdp::chat::jinja {
namespace {

const char* const kStrMethods[] = {
    "capitalize",   "casefold",   "center",    "count",       "encode",    "endswith",     "expandtabs",   "find",
    "format",       "format_map", "index",     "isalnum",     "isalpha",   "isascii",      "isdecimal",    "isdigit",
    "isidentifier", "islower",    "isnumeric", "isprintable", "isspace",   "istitle",      "isupper",      "join",
    "ljust",        "lower",      "lstrip",    "maketrans",   "partition", "removeprefix", "removesuffix", "replace",
    "rfind",        "rindex",     "rjust",     "rpartition",  "rsplit",    "rstrip",       "split",        "splitlines",
    "startswith",   "strip",      "swapcase",  "title",       "translate", "upper",        "zfill"};
const char* const kDictSafe[] = {"copy", "fromkeys", "get", "items", "keys", "values"};
const char* const kDictUnsafe[] = {"clear", "pop", "popitem", "setdefault", "update"};
const char* const kListSafe[] = {"copy", "count", "index"};
const char* const kListUnsafe[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
const char* const kNumberAttrs[] = {"real",       "imag",      "numerator", "denominator", "conjugate",
                                    "bit_length", "bit_count", "to_bytes",  "from_bytes",  "as_integer_ratio",
                                    "is_integer", "hex",       "fromhex"};

template <size_t N>
bool in_list(const char* const (&list)[N], const std::string& name) {
  return std::any_of(list, list + N, [&](const char* s) { return name == s; });
}

struct Method : Callable {
  Value self;
  std::string name;
  Value call(Interp& interp, CallArgs& args) const override { return call_method(interp, self, name, args); }
  std::string repr() const override { return ""; }
  std::string type_name() const override { return "builtin_function_or_method"; }
};

Value bound(const Value& self, const std::string& name) {
  auto m = std::make_shared<Method>();
  m->self = self;
  m->name = name;
  return Value::object(Type::kCallable, std::move(m));
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined_hint(
      "access to attribute " + py_repr_string(name) + " of " + py_repr_string(type_name(obj)) + " object is unsafe.",
      true);
}

Value loop_attr(const Value& obj, const std::string& name, bool* found) {
  const LoopObj& l = obj.loop();
  const auto i = static_cast<int64_t>(l.index0), n = static_cast<int64_t>(l.length());
  *found = true;
  if (name == "index") return Value::integer(i + 1);
  if (name == "index0") return Value::integer(i);
  if (name == "revindex") return Value::integer(n - i);
  if (name == "revindex0") return Value::integer(n - i - 1);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i == n - 1);
  if (name == "length") return Value::integer(n);
  if (name == "depth") return Value::integer(1);
  if (name == "depth0") return Value::integer(0);
  if (name == "previtem") {
    return i > 0 ? (*l.items)[l.begin + i - 1] : Value::undefined_hint("there is no previous item");
  }
  if (name == "nextitem")
    return i + 1 < n ? (*l.items)[l.begin + i + 1] : Value::undefined_hint("there is no next item");
  if (name == "cycle" || name == "changed") return bound(obj, name);
  *found = false;
  return Value();
}

// ---- str methods ----

bool is_space_at(std::string_view s, size_t pos, size_t* next) {
  *next = pos;
  return py_isspace(utf8_next(s, next));
}

std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<char32_t> set;
  if (chars != nullptr && !chars->is_none()) {
    if (!chars->is_string()) throw Failure("strip arg must be None or str");
    for (size_t p = 0; p < chars->str().size();) set.push_back(utf8_next(chars->str(), &p));
  }
  auto strippable = [&](char32_t cp) {
    return chars == nullptr || chars->is_none() ? py_isspace(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t begin = 0, end = s.size();
  while (left && begin < end) {
    size_t next = begin;
    if (!strippable(utf8_next(s, &next))) break;
    begin = next;
  }
  while (right && end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t p = start;
    if (!strippable(utf8_next(s, &p))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& p : parts) items.push_back(Value::string(std::move(p)));
  return Value::seq(std::move(items));
}

// str.split / str.rsplit without a separator: runs of whitespace.
std::vector<std::string> split_whitespace(const std::string& s, int64_t maxsplit, bool from_right) {
  std::vector<std::pair<size_t, size_t>> words;  // byte ranges
  size_t next;
  for (size_t p = 0; p < s.size();) {
    if (is_space_at(s, p, &next)) {
      p = next;
      continue;
    }
    const size_t start = p;
    while (p < s.size() && !is_space_at(s, p, &next)) p = next;
    words.emplace_back(start, p);
  }
  std::vector<std::string> out;
  if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
    for (const auto& [b, e] : words) out.push_back(s.substr(b, e - b));
    return out;
  }
  const auto k = static_cast<size_t>(maxsplit);
  if (!from_right) {
    for (size_t i = 0; i < k; ++i) out.push_back(s.substr(words[i].first, words[i].second - words[i].first));
    out.push_back(strip_chars(s.substr(words[k].first), nullptr, false, false));
    return out;
  }
  const size_t first_kept = words.size() - k;
  out.push_back(s.substr(0, words[first_kept - 1].second));
  for (size_t i = first_kept; i < words.size(); ++i)
    out.push_back(s.substr(words[i].first, words[i].second - words[i].first));
  return out;
}

std::vector<std::string> split_on(const std::string& s, const std::string& sep, int64_t maxsplit, bool from_right) {
  if (sep.empty()) throw Failure("empty separator");
  std::vector<std::string> out;
  if (!from_right) {
    size_t start = 0;
    for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      const size_t hit = s.find(sep, start);
      if (hit == std::string::npos) break;
      out.push_back(s.substr(start, hit - start));
      start = hit + sep.size();
    }
    out.push_back(s.substr(start));
    return out;
  }
  size_t end = s.size();
  for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
    if (end < sep.size()) break;
    const size_t hit = s.rfind(sep, end - sep.size());
    if (hit == std::string::npos) break;
    out.push_back(s.substr(hit + sep.size(), end - hit - sep.size()));
    end = hit;
  }
  out.push_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

Value str_split(const std::string& s, const CallArgs& args, bool from_right) {
  check_args(args, from_right ? "rsplit" : "split", 2, {"sep", "maxsplit"});
  const Value sep = arg_or(args, 0, "sep", Value::none());
  const Value maxsplit = arg_or(args, 1, "maxsplit", Value::integer(-1));
  if (maxsplit.type() != Type::kInt && maxsplit.type() != Type::kBool) throw Failure("maxsplit must be an integer");
  if (sep.is_none()) return str_list(split_whitespace(s, maxsplit.number_as_int(), from_right));
  if (!sep.is_string()) throw Failure("must be str or None, not " + type_name(sep));
  return str_list(split_on(s, sep.str(), maxsplit.number_as_int(), from_right));
}

Value str_splitlines(const std::string& s, const CallArgs& args) {
  check_args(args, "splitlines", 1, {"keepends"});
  return str_list(py_splitlines(s, truthy(arg_or(args, 0, "keepends", Value::boolean(false)))));
}

bool affix_matches(const std::string& s, const Value& affix, bool at_start) {
  auto one = [&](const Value& a) {
    if (!a.is_string())
      throw Failure("startswith/endswith first arg must be str or a tuple of str, not " + type_name(a));
    const std::string& x = a.str();
    if (x.size() > s.size()) return false;
    return at_start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_seq(SeqKind::kTuple)) {
    return std::any_of(affix.seq().items.begin(), affix.seq().items.end(), one);
  }
  return one(affix);
}

std::string str_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {  // Python inserts `repl` around every character
    for (size_t p = 0; p <= s.size();) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (p == s.size()) break;
      const size_t start = p;
      utf8_next(s, &p);
      out.append(s, start, p - start);
    }
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old, start);
    if (hit == std::string::npos) break;
    out.append(s, start, hit - start);
    out += repl;
    start = hit + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

const std::string& str_arg(const CallArgs& args, size_t i, const char* method) {
  if (args.positional.size() <= i) throw Failure(std::string(method) + "() missing a required argument");
  const Value& v = args.positional[i];
  if (!v.is_string()) throw Failure(std::string(method) + "() argument must be str, not " + type_name(v));
  return v.str();
}

Value str_find(const std::string& s, const std::string& method, const CallArgs& args) {
  check_args(args, method.c_str(), 1, {});
  const std::string& sub = str_arg(args, 0, method.c_str());
  if (method == "count") {
    if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value::integer(n);
  }
  const bool right = method[0] == 'r';
  const size_t hit = right ? s.rfind(sub) : s.find(sub);
  if (hit == std::string::npos) {
    if (method == "index" || method == "rindex") throw Failure("substring not found");
    return Value::integer(-1);
  }
  return Value::integer(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, hit))));
}

Value str_pad(const std::string& s, const std::string& method, const CallArgs& args) {
  check_args(args, method.c_str(), method == "zfill" ? 1 : 2, {});
  const Value* width_arg = find_arg(args, 0, "width");
  if (width_arg == nullptr || (width_arg->type() != Type::kInt && width_arg->type() != Type::kBool)) {
    throw Failure(method + "() needs an integer width");
  }
  const int64_t width = width_arg->number_as_int();
  std::string fill = " ";
  if (const Value* f = find_arg(args, 1, "fillchar")) {
    if (!f->is_string() || utf8_length(f->str()) != 1)
      throw Failure("The fill character must be exactly one character long");
    fill = f->str();
  }
  const auto len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return Value::string(s);
  const int64_t pad = width - len;
  auto repeat = [](const std::string& x, int64_t n) {
    std::string r;
    for (int64_t i = 0; i < n; ++i) r += x;
    return r;
  };
  if (method == "ljust") return Value::string(s + repeat(fill, pad));
  if (method == "rjust") return Value::string(repeat(fill, pad) + s);
  if (method == "center") {
    const int64_t left = pad / 2 + (pad & width & 1);
    return Value::string(repeat(fill, left) + s + repeat(fill, pad - left));
  }
  // zfill: zeros after a leading sign
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) return Value::string(s.substr(0, 1) + repeat("0", pad) + s.substr(1));
  return Value::string(repeat("0", pad) + s);
}

Value str_is(const std::string& s, const std::string& method) {
  if (method == "isspace") {
    if (s.empty()) return Value::boolean(false);
    for (size_t p = 0, next; p < s.size(); p = next) {
      if (!is_space_at(s, p, &next)) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  if (method == "islower") return Value::boolean(py_islower(s));
  if (method == "isupper") return Value::boolean(py_isupper(s));
  if (method == "isprintable") {
    for (size_t p = 0; p < s.size();) {
      if (!py_isprintable(utf8_next(s, &p))) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  if (method == "isascii") {
    return Value::boolean(std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }));
  }
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) throw Failure("str." + method + "() on non-ASCII text is not supported");
  }
  auto all = [&](auto pred) { return !s.empty() && std::all_of(s.begin(), s.end(), pred); };
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  if (method == "isdigit" || method == "isdecimal" || method == "isnumeric") return Value::boolean(all(digit));
  if (method == "isalpha") return Value::boolean(all(alpha));
  if (method == "isalnum") return Value::boolean(all([&](char c) { return digit(c) || alpha(c); }));
  throw Failure("str." + method + "() is not supported");
}

Value str_partition(const std::string& s, const CallArgs& args, bool right) {
  check_args(args, right ? "rpartition" : "partition", 1, {});
  const std::string& sep = str_arg(args, 0, "partition");
  if (sep.empty()) throw Failure("empty separator");
  const size_t hit = right ? s.rfind(sep) : s.find(sep);
  std::vector<Value> parts;
  if (hit == std::string::npos) {
    parts = right ? std::vector<Value>{Value::string(""), Value::string(""), Value::string(s)}
                  : std::vector<Value>{Value::string(s), Value::string(""), Value::string("")};
  } else {
    parts = {Value::string(s.substr(0, hit)), Value::string(sep), Value::string(s.substr(hit + sep.size()))};
  }
  return Value::seq(std::move(parts), SeqKind::kTuple);
}

Value str_join(const std::string& sep, const CallArgs& args) {
  check_args(args, "join", 1, {});
  if (args.positional.empty()) throw Failure("join() takes exactly one argument (0 given)");
  const Items items = py_iter(args.positional[0]);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      throw Failure("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(items[i]) +
                    " found");
    }
    if (i) out += sep;
    out += items[i].str();
  }
  return Value::string(std::move(out));
}

Value string_method(Interp& interp, const std::string& s, const std::string& name, const CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    check_args(args, name.c_str(), 1, {});
    const Value* chars = args.positional.empty() ? nullptr : &args.positional[0];
    return Value::string(strip_chars(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") return str_split(s, args, name == "rsplit");
  if (name == "splitlines") return str_splitlines(s, args);
  if (name == "startswith" || name == "endswith") {
    check_args(args, name.c_str(), 1, {});
    if (args.positional.empty()) throw Failure(name + "() takes at least 1 argument (0 given)");
    return Value::boolean(affix_matches(s, args.positional[0], name == "startswith"));
  }
  if (name == "replace") {
    check_args(args, "replace", 3, {});
    const Value count = args.positional.size() > 2 ? args.positional[2] : Value::integer(-1);
    if (count.type() != Type::kInt && count.type() != Type::kBool) throw Failure("replace() count must be an integer");
    return Value::string(
        str_replace(s, str_arg(args, 0, "replace"), str_arg(args, 1, "replace"), count.number_as_int()));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    check_args(args, name.c_str(), 0, {});
    return Value::string(name == "upper"   ? py_upper(s)
                         : name == "lower" ? py_lower(s)
                         : name == "title" ? py_title(s)
                                           : py_capitalize(s));
  }
  if (name == "format") return Value::string(format_method(interp, s, args));
  if (name == "join") return str_join(s, args);
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return str_find(s, name, args);
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") return str_pad(s, name, args);
  if (name.rfind("is", 0) == 0) {
    check_args(args, name.c_str(), 0, {});
    return str_is(s, name);
  }
  if (name == "partition" || name == "rpartition") return str_partition(s, args, name == "rpartition");
  if (name == "removeprefix" || name == "removesuffix") {
    check_args(args, name.c_str(), 1, {});
    const std::string& a = str_arg(args, 0, name.c_str());
    const bool pre = name == "removeprefix";
    if (a.size() <= s.size() &&
        (pre ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0)) {
      return Value::string(pre ? s.substr(a.size()) : s.substr(0, s.size() - a.size()));
    }
    return Value::string(s);
  }
  throw Failure("str." + name + "() is not supported");
}

// ---- dict, list, loop methods ----

Value dict_method(const Value& self, const std::string& name, const CallArgs& args) {
  const DictObj& d = self.dict();
  if (name == "get") {
    check_args(args, "get", 2, {});
    if (args.positional.empty()) throw Failure("get expected at least 1 argument, got 0");
    if (!is_hashable(args.positional[0]))
      throw Failure("unhashable type: " + py_repr_string(type_name(args.positional[0])));
    const Value* v = d.find(args.positional[0]);
    if (v != nullptr) return *v;
    return args.positional.size() > 1 ? args.positional[1] : Value::none();
  }
  check_args(args, name.c_str(), 0, {});
  if (name == "copy") return self;  // immutable: a copy is indistinguishable
  std::vector<Value> items;
  items.reserve(d.items.size());
  for (const auto& [k, v] : d.items) {
    if (name == "keys") {
      items.push_back(k);
    } else if (name == "values") {
      items.push_back(v);
    } else if (name == "items") {
      items.push_back(Value::seq({k, v}, SeqKind::kTuple));
    } else {
      throw Failure("dict." + name + "() is not supported");
    }
  }
  return Value::seq(std::move(items), name == "keys"     ? SeqKind::kDictKeys
                                      : name == "values" ? SeqKind::kDictValues
                                                         : SeqKind::kDictItems);
}

Value seq_method(const Value& self, const std::string& name, const CallArgs& args) {
  const auto& items = self.seq().items;
  if (name == "copy") {
    check_args(args, "copy", 0, {});
    return self;
  }
  check_args(args, name.c_str(), 1, {});
  if (args.positional.empty()) throw Failure(name + "() takes exactly one argument (0 given)");
  const Value& x = args.positional[0];
  if (name == "count") {
    return Value::integer(std::count_if(items.begin(), items.end(), [&](const Value& v) { return py_equal(v, x); }));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (py_equal(items[i], x)) return Value::integer(static_cast<int64_t>(i));
  }
  throw Failure(py_repr(x) + " is not in " + type_name(self));
}

Value loop_method(const Value& self, const std::string& name, const CallArgs& args) {
  const LoopObj& l = self.loop();
  if (!args.keyword.empty()) throw Failure("loop." + name + "() takes no keyword arguments");
  if (name == "cycle") {
    if (args.positional.empty()) throw Failure("no items for cycling given");
    return args.positional[l.index0 % args.positional.size()];
  }
  const Value value = Value::seq(args.positional, SeqKind::kTuple);  // changed(*value)
  if (l.has_changed_value && py_equal(l.changed_value, value)) return Value::boolean(false);
  l.has_changed_value = true;
  l.changed_value = value;
  return Value::boolean(true);
}

// ---- globals ----

enum class GlobalId { kRange, kNamespace, kDict, kRaise, kStrftime, kLipsum, kCycler, kJoiner };

Value make_dict(const CallArgs& args, const char* what) {
  if (args.positional.size() > 1) throw Failure(std::string(what) + " expected at most 1 argument");
  DictObj d;
  if (!args.positional.empty()) {
    const Value& src = args.positional[0];
    if (src.is_dict()) {
      d = src.dict();
    } else {
      const Items items = py_iter(src);
      for (size_t i = 0; i < items.size(); ++i) {
        const Items pair = py_iter(items[i]);
        if (pair.size() != 2) throw Failure("dictionary update sequence element has the wrong length");
        d.set(pair[0], pair[1]);
      }
    }
  }
  for (const auto& [k, v] : args.keyword) d.set(Value::string(k), v);
  return Value::dict(std::move(d));
}

Value make_range(const CallArgs& args) {
  if (!args.keyword.empty()) throw Failure("range() takes no keyword arguments");
  if (args.positional.empty() || args.positional.size() > 3) throw Failure("range expected 1 to 3 arguments");
  for (const Value& v : args.positional) {
    if (v.type() != Type::kInt && v.type() != Type::kBool) {
      throw Failure(py_repr_string(type_name(v)) + " object cannot be interpreted as an integer");
    }
  }
  const size_t n = args.positional.size();
  const int64_t start = n == 1 ? 0 : args.positional[0].number_as_int();
  const int64_t stop = n == 1 ? args.positional[0].number_as_int() : args.positional[1].number_as_int();
  const int64_t step = n == 3 ? args.positional[2].number_as_int() : 1;
  if (step == 0) throw Failure("range() arg 3 must not be zero");
  const double count = step > 0 ? std::max(0.0, std::ceil((double(stop) - double(start)) / double(step)))
                                : std::max(0.0, std::ceil((double(start) - double(stop)) / double(-step)));
  if (count > 100000) {
    throw Failure("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.push_back(Value::integer(i));
  Value out = Value::seq(std::move(items), SeqKind::kRange);
  auto& r = const_cast<SeqObj&>(out.seq());
  r.range_start = start;
  r.range_stop = stop;
  r.range_step = step;
  return out;
}

std::string strftime_now(std::time_t now, const std::string& format) {
  // datetime.now().strftime: naive, so %z and %Z are empty; %f is the microseconds (we have none).
  std::string fmt;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      fmt += format[i];
      continue;
    }
    const char c = format[++i];
    if (c == 'f') {
      fmt += "000000";
    } else if (c != 'z' && c != 'Z') {
      fmt += '%';
      fmt += c;
    }
  }
  std::tm tm{};
  localtime_r(&now, &tm);
  std::string out(fmt.size() * 16 + 256, '\0');
  out.resize(std::strftime(out.data(), out.size(), fmt.c_str(), &tm));
  return out;
}

struct Builtin : Callable {
  GlobalId id;
  explicit Builtin(GlobalId i) : id(i) {}

  Value call(Interp& interp, CallArgs& args) const override {
    switch (id) {
      case GlobalId::kRange:
        return make_range(args);
      case GlobalId::kDict:
        return make_dict(args, "dict");
      case GlobalId::kNamespace: {
        const Value d = make_dict(args, "namespace");
        auto ns = std::make_shared<NamespaceObj>();
        for (const auto& [k, v] : d.dict().items) {
          if (k.is_string() && !k.str().empty() && k.str()[0] == '_') {
            throw Failure("Chat templates cannot store underscore-prefixed attributes on a namespace, but got " +
                          py_repr(k) + ". Please rename the attribute.");
          }
        }
        ns->attrs = d.dict();
        interp.track(ns);
        return Value::object(Type::kNamespace, std::move(ns));
      }
      case GlobalId::kRaise:
        if (args.positional.size() != 1 || !args.keyword.empty()) throw Failure("raise_exception() takes one argument");
        throw Raised{py_str(args.positional[0]), interp.line};
      case GlobalId::kStrftime:
        if (args.positional.size() != 1 || !args.positional[0].is_string() || !args.keyword.empty()) {
          throw Failure("strftime_now() takes one string argument");
        }
        return Value::string(strftime_now(interp.now(), args.positional[0].str()));
      default:
        throw Failure(type_name() + "() is not supported");
    }
  }
  std::string repr() const override { return id == GlobalId::kRange ? "<class 'range'>" : ""; }
  std::string type_name() const override {
    static const char* const kNames[] = {"range",        "namespace", "dict",   "raise_exception",
                                         "strftime_now", "lipsum",    "cycler", "joiner"};
    return kNames[static_cast<int>(id)];
  }
};

}  // namespace

const Value* find_arg(const CallArgs& args, size_t index, const char* name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& kv : args.keyword) {
    if (kv.first == name) return &kv.second;
  }
  return nullptr;
}

Value arg_or(const CallArgs& args, size_t index, const char* name, const Value& fallback) {
  const Value* v = find_arg(args, index, name);
  return v != nullptr ? *v : fallback;
}

void check_args(const CallArgs& args, const char* what, size_t max, std::initializer_list<const char*> names) {
  if (args.positional.size() > max) {
    throw Failure(std::string(what) + "() takes at most " + std::to_string(max) + " argument(s) (" +
                  std::to_string(args.positional.size()) + " given)");
  }
  for (const auto& kv : args.keyword) {
    if (std::none_of(names.begin(), names.end(), [&](const char* n) { return kv.first == n; })) {
      throw Failure(std::string(what) + "() got an unexpected keyword argument " + py_repr_string(kv.first));
    }
  }
}

Value builtin_attr(const Value& obj, const std::string& name, bool* found) {
  *found = true;
  switch (obj.type()) {
    case Type::kString:
      if (in_list(kStrMethods, name)) return bound(obj, name);
      break;
    case Type::kDict:
      if (in_list(kDictSafe, name)) return bound(obj, name);
      if (in_list(kDictUnsafe, name)) return unsafe(obj, name);
      break;
    case Type::kSeq:
      if (obj.is_seq(SeqKind::kList) && in_list(kListUnsafe, name)) return unsafe(obj, name);
      if ((obj.is_list_or_tuple() || obj.is_seq(SeqKind::kRange)) && (name == "count" || name == "index")) {
        return bound(obj, name);
      }
      if (obj.is_seq(SeqKind::kList) && name == "copy") return bound(obj, name);
      if (obj.is_seq(SeqKind::kRange) && (name == "start" || name == "stop" || name == "step")) {
        const SeqObj& r = obj.seq();
        return Value::integer(name == "start" ? r.range_start : name == "stop" ? r.range_stop : r.range_step);
      }
      break;
    case Type::kLoop:
      return loop_attr(obj, name, found);
    case Type::kInt:
    case Type::kFloat:
    case Type::kBool:
      if (in_list(kNumberAttrs, name)) throw Failure("the attribute '" + name + "' of numbers is not supported");
      break;
    case Type::kCallable:
      throw Failure("attributes of a " + type_name(obj) + " are not supported");
    default:
      break;
  }
  *found = false;
  return Value();
}

Value call_method(Interp& interp, const Value& self, const std::string& name, CallArgs& args) {
  switch (self.type()) {
    case Type::kString:
      if (self.is_markup()) throw Failure("methods of |safe or |escape strings are not supported");
      return string_method(interp, self.str(), name, args);
    case Type::kDict:
      if (name == "fromkeys") throw Failure("dict.fromkeys() is not supported");
      return dict_method(self, name, args);
    case Type::kSeq:
      return seq_method(self, name, args);
    case Type::kLoop:
      return loop_method(self, name, args);
    default:
      throw Failure(type_name(self) + "." + name + "() is not supported");
  }
}

Value global_value(const std::string& name, bool* found) {
  static const char* const kNames[] = {"range",        "namespace", "dict",   "raise_exception",
                                       "strftime_now", "lipsum",    "cycler", "joiner"};
  static const std::vector<Value> kValues = [] {
    std::vector<Value> v;
    for (int i = 0; i < 8; ++i) v.push_back(Value::object(Type::kCallable, std::make_shared<Builtin>(GlobalId(i))));
    return v;
  }();
  for (int i = 0; i < 8; ++i) {
    if (name == kNames[i]) {
      *found = true;
      return kValues[i];
    }
  }
  *found = false;
  return Value();
}

}  // namespace fsdp::chat::jinja

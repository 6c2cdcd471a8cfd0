#include "chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/template_limits.h"
#include "chat/jinja_unicode.h"

namespace fsdp::chat::jinja {
namespace {

// Python's object_type_repr as jinja2 uses it in Undefined messages: "dict object", "None".
std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

std::string hex(uint32_t value, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%0*x", digits, value);
  return buf;
}

// -1, 0, 1, or 2 when unordered (a NaN), comparing exactly as Python does for int and float.
int compare_numbers(const Value& a, const Value& b) {
  if (a.type() != Type::kFloat && b.type() != Type::kFloat) {
    const int64_t x = a.number_as_int(), y = b.number_as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.type() == Type::kFloat && b.type() == Type::kFloat) {
    const double x = a.as_float(), y = b.as_float();
    if (std::isnan(x) || std::isnan(y)) return 2;
    return x < y ? -1 : x > y ? 1 : 0;
  }
  const bool float_first = a.type() == Type::kFloat;
  const double f = float_first ? a.as_float() : b.as_float();
  const int64_t i = float_first ? b.number_as_int() : a.number_as_int();
  int r;  // compare i with f
  if (std::isnan(f)) return 2;
  const double di = static_cast<double>(i);
  if (di != f || std::isinf(f)) {
    r = di < f ? -1 : 1;
  } else if (f >= 9.2233720368547758e18) {
    r = -1;  // f == 2**63 exactly, above every int64
  } else {
    const auto fi = static_cast<int64_t>(f);
    r = i < fi ? -1 : i > fi ? 1 : 0;
  }
  return float_first ? -r : r;
}

bool seq_equal(const SeqObj& a, const SeqObj& b) {
  if (a.items.size() != b.items.size()) return false;
  for (size_t i = 0; i < a.items.size(); ++i) {
    if (!py_equal(a.items[i], b.items[i])) return false;
  }
  return true;
}

// Set equality, for dict_keys and dict_items.
bool same_members(const SeqObj& a, const SeqObj& b) {
  if (a.items.size() != b.items.size()) return false;
  for (const Value& x : a.items) {
    if (std::none_of(b.items.begin(), b.items.end(), [&](const Value& y) { return py_equal(x, y); })) return false;
  }
  return true;
}

bool dict_equal(const DictObj& a, const DictObj& b) {
  if (a.items.size() != b.items.size()) return false;
  for (const auto& [k, v] : a.items) {
    const Value* other = b.find(k);
    if (other == nullptr || !py_equal(v, *other)) return false;
  }
  return true;
}

void append_seq_repr(std::string& out, const SeqObj& s) {
  switch (s.kind) {
    case SeqKind::kRange:
      out += "range(" + std::to_string(s.range_start) + ", " + std::to_string(s.range_stop);
      if (s.range_step != 1) out += ", " + std::to_string(s.range_step);
      out += ")";
      return;
    case SeqKind::kGenerator:
      throw Failure("cannot print a generator (Python prints its address): add |list");
    default:
      break;
  }
  const char* prefix = s.kind == SeqKind::kDictKeys     ? "dict_keys(["
                       : s.kind == SeqKind::kDictValues ? "dict_values(["
                       : s.kind == SeqKind::kDictItems  ? "dict_items(["
                       : s.kind == SeqKind::kTuple      ? "("
                                                        : "[";
  out += prefix;
  for (size_t i = 0; i < s.items.size(); ++i) {
    if (i) out += ", ";
    out += py_repr(s.items[i]);
  }
  if (s.kind == SeqKind::kTuple) {
    out += s.items.size() == 1 ? ",)" : ")";
  } else {
    out += s.kind == SeqKind::kList ? "]" : "])";
  }
}

void append_dict_repr(std::string& out, const DictObj& d) {
  out += '{';
  for (size_t i = 0; i < d.items.size(); ++i) {
    if (i) out += ", ";
    out += py_repr(d.items[i].first);
    out += ": ";
    out += py_repr(d.items[i].second);
  }
  out += '}';
}

}  // namespace

RenderBudget*& render_budget() {
  thread_local RenderBudget* budget = nullptr;
  return budget;
}

void RenderBudget::charge(int64_t units) {
  work += units;
  if (work > limits->max_iterations)
    throw Failure(over_limit("the template did more steps (loop iterations, list items and KiB of strings made) than",
                             limits->max_iterations, "data.chat_template_max_iterations"));
}

Value Value::string(std::string text, bool markup) {
  if (RenderBudget* b = render_budget()) {
    if (static_cast<int64_t>(text.size()) > b->limits->max_string_bytes)
      throw Failure(over_limit("the template made a string longer than", b->limits->max_string_bytes,
                               "data.chat_template_max_string"));
    b->charge(1 + static_cast<int64_t>(text.size() >> 10));
  }
  auto obj = std::make_shared<StringObj>();
  obj->text = std::move(text);
  obj->markup = markup;
  Value v(Type::kString);
  v.obj_ = std::move(obj);
  return v;
}

Value Value::seq(std::vector<Value> items, SeqKind kind) {
  if (RenderBudget* b = render_budget()) b->charge(static_cast<int64_t>(items.size()));
  auto obj = std::make_shared<SeqObj>();
  obj->items = std::move(items);
  obj->kind = kind;
  Value v(Type::kSeq);
  v.obj_ = std::move(obj);
  return v;
}

Value Value::dict(DictObj d) {
  Value v(Type::kDict);
  v.obj_ = std::make_shared<DictObj>(std::move(d));
  return v;
}

Value Value::object(Type type, std::shared_ptr<const Object> obj) {
  Value v(type);
  v.obj_ = std::move(obj);
  return v;
}

Value Value::undefined_name(std::string name) {
  return undefined_hint(py_repr_string(name) + " is undefined");
}

Value Value::undefined_attr(const Value& owner, const Value& key) {
  if (key.is_string()) {
    return undefined_hint(py_repr_string(object_type_repr(owner)) + " has no attribute " + py_repr(key));
  }
  return undefined_hint(object_type_repr(owner) + " has no element " + py_repr(key));
}

Value Value::undefined_hint(std::string hint, bool security) {
  auto obj = std::make_shared<UndefinedObj>();
  obj->message = std::move(hint);
  obj->security = security;
  Value v(Type::kUndefined);
  v.obj_ = std::move(obj);
  return v;
}

Value Value::missing() {
  static const Value kMissing = [] {
    auto obj = std::make_shared<UndefinedObj>();
    obj->missing = true;
    Value v(Type::kUndefined);
    v.obj_ = std::move(obj);
    return v;
  }();
  return kMissing;
}

bool Value::is_seq(SeqKind kind) const {
  return type_ == Type::kSeq && seq().kind == kind;
}
bool Value::is_missing() const {
  return has_undef_info() && undef().missing;
}
bool Value::is_markup() const {
  return type_ == Type::kString && static_cast<const StringObj&>(*obj_).markup;
}
const std::string& Value::str() const {
  return static_cast<const StringObj&>(*obj_).text;
}
const SeqObj& Value::seq() const {
  return static_cast<const SeqObj&>(*obj_);
}
const DictObj& Value::dict() const {
  return static_cast<const DictObj&>(*obj_);
}
const NamespaceObj& Value::ns() const {
  return static_cast<const NamespaceObj&>(*obj_);
}
const UndefinedObj& Value::undef() const {
  return static_cast<const UndefinedObj&>(*obj_);
}
const Callable& Value::callable() const {
  return static_cast<const Callable&>(*obj_);
}
const LoopObj& Value::loop() const {
  return static_cast<const LoopObj&>(*obj_);
}

const Value* DictObj::find(std::string_view key) const {
  for (const auto& kv : items) {
    if (kv.first.is_string() && kv.first.str() == key) return &kv.second;
  }
  return nullptr;
}

const Value* DictObj::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  for (const auto& kv : items) {
    if (py_equal(kv.first, key)) return &kv.second;
  }
  return nullptr;
}

void DictObj::set(Value key, Value value) {
  if (!is_hashable(key)) throw Failure("unhashable type: " + py_repr_string(type_name(key)));
  for (auto& kv : items) {
    if (py_equal(kv.first, key)) {
      kv.second = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

bool truthy(const Value& v) {
  switch (v.type()) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
      return v.as_bool();
    case Type::kInt:
      return v.as_int() != 0;
    case Type::kFloat:
      return v.as_float() != 0.0;
    case Type::kString:
      return !v.str().empty();
    case Type::kSeq:
      return v.seq().kind == SeqKind::kGenerator || !v.seq().items.empty();
    case Type::kDict:
      return !v.dict().items.empty();
    case Type::kLoop:
      return v.loop().length() != 0;
    default:
      return true;
  }
}

std::string py_float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string s(buf, res.ptr);  // shortest round trip: "-1.2345e+17"
  std::string out;
  if (s[0] == '-') {
    out = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int decpt = std::stoi(s.substr(e + 1)) + 1;  // value = 0.DIGITS * 10**decpt
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) return out + "0." + std::string(-decpt, '0') + digits;
    if (decpt >= n) return out + digits + std::string(decpt - n, '0') + ".0";
    return out + digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  out += digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  const int exp = decpt - 1;
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + ebuf;
}

std::string py_repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const char32_t cp = utf8_next(s, &pos);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (py_isprintable(cp)) {
      out.append(s.substr(start, pos - start));
    } else if (cp <= 0xFF) {
      out += "\\x" + hex(cp, 2);
    } else if (cp <= 0xFFFF) {
      out += "\\u" + hex(cp, 4);
    } else {
      out += "\\U" + hex(cp, 8);
    }
  }
  out += quote;
  return out;
}

std::string type_name(const Value& v) {
  switch (v.type()) {
    case Type::kUndefined:
      return "Undefined";
    case Type::kNone:
      return "NoneType";
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "int";
    case Type::kFloat:
      return "float";
    case Type::kString:
      return v.is_markup() ? "Markup" : "str";
    case Type::kDict:
      return "dict";
    case Type::kNamespace:
      return "Namespace";
    case Type::kCallable:
      return v.callable().type_name();
    case Type::kLoop:
      return "LoopContext";
    case Type::kSeq:
      break;
  }
  switch (v.seq().kind) {
    case SeqKind::kList:
      return "list";
    case SeqKind::kTuple:
      return "tuple";
    case SeqKind::kGenerator:
      return "generator";
    case SeqKind::kRange:
      return "range";
    case SeqKind::kDictKeys:
      return "dict_keys";
    case SeqKind::kDictValues:
      return "dict_values";
    case SeqKind::kDictItems:
      return "dict_items";
  }
  return "object";
}

void append_py_str(std::string& out, const Value& v) {
  switch (v.type()) {
    case Type::kUndefined:
      return;
    case Type::kNone:
      out += "None";
      return;
    case Type::kBool:
      out += v.as_bool() ? "True" : "False";
      return;
    case Type::kInt: {
      char buf[24];
      const auto res = std::to_chars(buf, buf + sizeof buf, v.as_int());
      out.append(buf, res.ptr);
      return;
    }
    case Type::kFloat:
      out += py_float_repr(v.as_float());
      return;
    case Type::kString:
      out += v.str();
      return;
    default:
      out += py_repr(v);
  }
}

std::string py_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  append_py_str(out, v);
  return out;
}

std::string py_repr(const Value& v) {
  std::string out;
  switch (v.type()) {
    case Type::kUndefined:
      return "Undefined";
    case Type::kString:
      return v.is_markup() ? "Markup(" + py_repr_string(v.str()) + ")" : py_repr_string(v.str());
    case Type::kSeq:
      append_seq_repr(out, v.seq());
      return out;
    case Type::kDict:
      append_dict_repr(out, v.dict());
      return out;
    case Type::kNamespace:
      out = "<Namespace ";
      append_dict_repr(out, v.ns().attrs);
      return out + ">";
    case Type::kLoop:
      return "<LoopContext " + std::to_string(v.loop().index0 + 1) + "/" + std::to_string(v.loop().length()) + ">";
    case Type::kCallable:
      out = v.callable().repr();
      if (out.empty()) throw Failure("cannot print a " + type_name(v) + " (Python prints its address)");
      return out;
    default:
      append_py_str(out, v);
      return out;
  }
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return compare_numbers(a, b) == 0;
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Type::kUndefined:
    case Type::kNone:
      return true;
    case Type::kString:
      return a.str() == b.str();
    case Type::kDict:
      return dict_equal(a.dict(), b.dict());
    case Type::kSeq:
      break;
    default:
      return a.object_ptr() == b.object_ptr();
  }
  const SeqObj& x = a.seq();
  const SeqObj& y = b.seq();
  if (x.kind != y.kind) return false;
  switch (x.kind) {
    case SeqKind::kList:
    case SeqKind::kTuple:
    case SeqKind::kRange:
      return seq_equal(x, y);
    case SeqKind::kDictKeys:
    case SeqKind::kDictItems:
      return same_members(x, y);
    default:
      return &x == &y;
  }
}

int py_compare(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) return compare_numbers(a, b);
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  const bool both_lists = a.is_seq(SeqKind::kList) && b.is_seq(SeqKind::kList);
  const bool both_tuples = a.is_seq(SeqKind::kTuple) && b.is_seq(SeqKind::kTuple);
  if (both_lists || both_tuples) {
    const auto& x = a.seq().items;
    const auto& y = b.seq().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!py_equal(x[i], y[i])) return py_compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  throw Failure(std::string("'") + op + "' not supported between instances of " + py_repr_string(type_name(a)) +
                " and " + py_repr_string(type_name(b)));
}

int64_t py_len(const Value& v) {
  switch (v.type()) {
    case Type::kUndefined:
      return 0;
    case Type::kString:
      return static_cast<int64_t>(utf8_length(v.str()));
    case Type::kDict:
      return static_cast<int64_t>(v.dict().items.size());
    case Type::kLoop:
      return static_cast<int64_t>(v.loop().length());
    case Type::kSeq:
      if (v.seq().kind != SeqKind::kGenerator) return static_cast<int64_t>(v.seq().items.size());
      break;
    default:
      break;
  }
  throw Failure("object of type " + py_repr_string(type_name(v)) + " has no len()");
}

bool is_hashable(const Value& v) {
  switch (v.type()) {
    case Type::kDict:
      return false;
    case Type::kSeq:
      if (v.seq().kind == SeqKind::kTuple) {
        return std::all_of(v.seq().items.begin(), v.seq().items.end(), is_hashable);
      }
      return v.seq().kind == SeqKind::kRange || v.seq().kind == SeqKind::kGenerator;
    default:
      return true;
  }
}

bool py_contains(const Value& haystack, const Value& needle) {
  switch (haystack.type()) {
    case Type::kUndefined:
      return false;
    case Type::kString:
      if (!needle.is_string()) {
        throw Failure("'in <string>' requires string as left operand, not " + type_name(needle));
      }
      return haystack.str().find(needle.str()) != std::string::npos;
    case Type::kDict:
      if (!is_hashable(needle)) throw Failure("unhashable type: " + py_repr_string(type_name(needle)));
      return haystack.dict().find(needle) != nullptr;
    case Type::kSeq: {
      const Items items = py_iter(haystack);
      for (size_t i = 0; i < items.size(); ++i) {
        if (py_equal(items[i], needle)) {
          if (haystack.seq().kind == SeqKind::kGenerator) haystack.seq().consumed = items.begin + i + 1;
          return true;
        }
      }
      return false;
    }
    default:
      throw Failure("argument of type " + py_repr_string(type_name(haystack)) + " is not iterable");
  }
}

Items py_iter(const Value& v) {
  Items out;
  switch (v.type()) {
    case Type::kSeq: {
      const SeqObj& s = v.seq();
      out.items = std::shared_ptr<const std::vector<Value>>(v.object_ptr(), &s.items);
      if (s.kind == SeqKind::kGenerator) {
        out.begin = s.consumed;
        s.consumed = s.items.size();
      }
      return out;
    }
    case Type::kDict: {
      auto keys = std::make_shared<std::vector<Value>>();
      for (const auto& kv : v.dict().items) keys->push_back(kv.first);
      out.items = std::move(keys);
      return out;
    }
    case Type::kString: {
      auto chars = std::make_shared<std::vector<Value>>();
      const std::string& s = v.str();
      for (size_t pos = 0; pos < s.size();) {
        const size_t start = pos;
        utf8_next(s, &pos);
        chars->push_back(Value::string(s.substr(start, pos - start)));
      }
      out.items = std::move(chars);
      return out;
    }
    case Type::kUndefined:
      out.items = std::make_shared<std::vector<Value>>();
      return out;
    default:
      throw Failure(py_repr_string(type_name(v)) + " object is not iterable");
  }
}

void fail_undefined(const Value& v) {
  if (v.has_undef_info() && !v.undef().missing) throw Failure(v.undef().message);
  throw Failure("undefined value used");
}

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    throw Failure("integer overflow (Python integers are unbounded; not supported)");
  return r;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw Failure("integer overflow (Python integers are unbounded; not supported)");
  return r;
}

}  // namespace fsdp::chat::jinja

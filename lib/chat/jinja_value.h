// The values a Jinja template computes with, and the Python semantics jinja2 gives them: str(),
// repr(), truth, ==, <, len(), iteration, json.dumps. Internal to lib/chat (jinja.h is the API).
//
// A Value is a small handle (32 bytes): scalars inline, everything else in a shared, immutable
// object, so copies are cheap. Nothing is mutated after it is built except a Namespace's
// attributes, a generator's read position and a loop's state: ImmutableSandboxedEnvironment
// forbids list.append, dict.update and the like. Values are used by one render at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja_failure.h"

namespace fsdp::chat {
struct TemplateLimits;  // chat/jinja.h
}

namespace fsdp::chat::jinja {

// What the render running on this thread may still do (null outside a render): Value::string and
// Value::seq charge it, as the interpreter's loops do, so that a template cannot build without
// bound (TemplateLimits). Set by the interpreter for its render.
struct RenderBudget {
  const TemplateLimits* limits = nullptr;
  int64_t work = 0;  // loop iterations, list items made, KiB of strings made
  // Adds `units` of work; throws Failure past limits->max_iterations.
  void charge(int64_t units);
};
RenderBudget*& render_budget();

using Json = nlohmann::ordered_json;

enum class Type : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kSeq,
  kDict,
  kNamespace,
  kCallable,
  kLoop,
};

// The Python sequence-like types a template meets; all keep their items in a vector. A generator
// (what map/select/unique return) is always true, has no len() and is used up by iterating it.
enum class SeqKind : uint8_t { kList, kTuple, kGenerator, kRange, kDictKeys, kDictValues, kDictItems };

struct Object {
  virtual ~Object() = default;
};

class Value;
struct StringObj;
struct SeqObj;
struct DictObj;
struct NamespaceObj;
struct UndefinedObj;
struct Callable;
struct LoopObj;

class Value {
 public:
  Value() : type_(Type::kUndefined), i_(0) {}  // an Undefined without a name

  static Value none() { return Value(Type::kNone); }
  static Value boolean(bool b) {
    Value v(Type::kBool);
    v.b_ = b;
    return v;
  }
  static Value integer(int64_t i) {
    Value v(Type::kInt);
    v.i_ = i;
    return v;
  }
  static Value floating(double f) {
    Value v(Type::kFloat);
    v.f_ = f;
    return v;
  }
  static Value string(std::string text, bool markup = false);
  static Value seq(std::vector<Value> items, SeqKind kind = SeqKind::kList);
  static Value dict(DictObj d);
  static Value object(Type type, std::shared_ptr<const Object> obj);
  // Undefined values: a missing variable, a missing attribute or key of `owner`, or one with a
  // ready message (`security`: using it is a SecurityError, as the sandbox's unsafe attributes).
  static Value undefined_name(std::string name);
  static Value undefined_attr(const Value& owner, const Value& key);
  static Value undefined_hint(std::string hint, bool security = false);
  // The marker of a variable a frame will assign but has not yet (jinja2 reads it as undefined).
  static Value missing();

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_number() const { return type_ == Type::kInt || type_ == Type::kFloat || type_ == Type::kBool; }
  bool is_seq() const { return type_ == Type::kSeq; }
  bool is_seq(SeqKind kind) const;
  bool is_list_or_tuple() const { return is_seq(SeqKind::kList) || is_seq(SeqKind::kTuple); }
  bool is_dict() const { return type_ == Type::kDict; }
  bool is_missing() const;
  bool is_markup() const;

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }  // kInt (kBool: use number_as_int)
  double as_float() const { return f_; }
  int64_t number_as_int() const { return type_ == Type::kBool ? b_ : i_; }
  double number_as_double() const { return type_ == Type::kFloat ? f_ : static_cast<double>(number_as_int()); }
  const std::string& str() const;  // kString
  const SeqObj& seq() const;
  const DictObj& dict() const;
  const NamespaceObj& ns() const;
  const UndefinedObj& undef() const;  // only when it has one (undefined_*)
  bool has_undef_info() const { return type_ == Type::kUndefined && obj_ != nullptr; }
  const Callable& callable() const;
  const LoopObj& loop() const;
  const std::shared_ptr<const Object>& object_ptr() const { return obj_; }

 private:
  explicit Value(Type t) : type_(t), i_(0) {}

  Type type_;
  union {
    bool b_;
    int64_t i_;
    double f_;
  };
  std::shared_ptr<const Object> obj_;
};

struct StringObj : Object {
  std::string text;
  bool markup = false;  // markupsafe.Markup (from |safe or |escape): `+` escapes the other side
};

struct SeqObj : Object {
  std::vector<Value> items;
  SeqKind kind = SeqKind::kList;
  int64_t range_start = 0, range_stop = 0, range_step = 1;  // kRange, for repr
  mutable size_t consumed = 0;                              // kGenerator: items already taken
};

// A Python dict: insertion order, keys compared with Python equality (1 == 1.0 == True).
struct DictObj : Object {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Inserts or replaces (keeping the first position), as d[key] = value. Throws Failure for an
  // unhashable key.
  void set(Value key, Value value);
};

// jinja2's namespace(): the one mutable object templates have.
struct NamespaceObj : Object {
  mutable DictObj attrs;
};

struct UndefinedObj : Object {
  std::string message;  // what using it raises
  bool security = false;
  bool missing = false;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

class Interp;

// Something a template can call: a macro, a global function, a bound method, loop.cycle.
struct Callable : Object {
  // Throws Failure for bad arguments.
  virtual Value call(Interp& interp, CallArgs& args) const = 0;
  // Python's repr; empty when it would not be deterministic (object addresses), so printing refuses.
  virtual std::string repr() const = 0;
  virtual std::string type_name() const = 0;
};

// jinja2's LoopContext for the loop being run.
struct LoopObj : Object {
  std::shared_ptr<const std::vector<Value>> items;
  size_t begin = 0;  // items[begin..] are the loop's
  mutable size_t index0 = 0;
  mutable bool has_changed_value = false;
  mutable Value changed_value;
  size_t length() const { return items->size() - begin; }
};

// Python semantics.
bool truthy(const Value& v);
std::string py_str(const Value& v);
void append_py_str(std::string& out, const Value& v);
std::string py_repr(const Value& v);
std::string py_repr_string(std::string_view s);
std::string py_float_repr(double f);
std::string type_name(const Value& v);
bool py_equal(const Value& a, const Value& b);
// -1, 0 or 1 for a < b, a == b, a > b; throws Failure ('<' not supported between ...) like Python.
int py_compare(const Value& a, const Value& b, const char* op);
int64_t py_len(const Value& v);
bool is_hashable(const Value& v);
// `needle in haystack`.
bool py_contains(const Value& haystack, const Value& needle);
// Iterating a value (a generator is used up): the items, from `begin`.
struct Items {
  std::shared_ptr<const std::vector<Value>> items;
  size_t begin = 0;
  size_t size() const { return items->size() - begin; }
  const Value& operator[](size_t i) const { return (*items)[begin + i]; }
};
Items py_iter(const Value& v);
// Undefined's error message, for the operations that raise UndefinedError.
[[noreturn]] void fail_undefined(const Value& v);
int64_t checked_add(int64_t a, int64_t b);
int64_t checked_mul(int64_t a, int64_t b);

// Variables in, JSON out.
Value from_json(const Json& j);
struct JsonOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // per level, when has_indent
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// json.dumps(v, ...) as transformers' tojson filter calls it.
std::string to_json(const Value& v, const JsonOptions& options);

}  // namespace fsdp::chat::jinja

// Expressions: names, literals, operators with Python semantics, attribute and item access the
// way the sandbox does them (a missing key or a TypeError gives Undefined), slicing, calls.
#include <algorithm>
#include <cmath>

#include "chat/jinja_interp.h"
#include "chat/jinja_unicode.h"

namespace fsdp::chat::jinja {
namespace {

bool is_int_like(const Value& v) {
  return v.type() == Type::kInt || v.type() == Type::kBool;
}

[[noreturn]] void unsupported_operands(const char* op, const Value& a, const Value& b) {
  throw Failure(std::string("unsupported operand type(s) for ") + op + ": " + py_repr_string(type_name(a)) + " and " +
                py_repr_string(type_name(b)));
}

Value concat_markup(const Value& a, const Value& b) {
  // markupsafe: Markup + str escapes the str; the result is Markup.
  const std::string left = a.is_markup() ? a.str() : html_escape(a.str());
  const std::string right = b.is_markup() ? b.str() : html_escape(b.str());
  return Value::string(left + right, true);
}

Value add(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type() != Type::kFloat && b.type() != Type::kFloat) {
      return Value::integer(checked_add(a.number_as_int(), b.number_as_int()));
    }
    return Value::floating(a.number_as_double() + b.number_as_double());
  }
  if (a.is_string() && b.is_string()) {
    if (a.is_markup() || b.is_markup()) return concat_markup(a, b);
    return Value::string(a.str() + b.str());
  }
  const bool lists = a.is_seq(SeqKind::kList) && b.is_seq(SeqKind::kList);
  const bool tuples = a.is_seq(SeqKind::kTuple) && b.is_seq(SeqKind::kTuple);
  if (lists || tuples) {
    std::vector<Value> items = a.seq().items;
    items.insert(items.end(), b.seq().items.begin(), b.seq().items.end());
    return Value::seq(std::move(items), a.seq().kind);
  }
  if (a.is_string() && !a.is_markup()) {
    throw Failure("can only concatenate str (not \"" + type_name(b) + "\") to str");
  }
  unsupported_operands("+", a, b);
}

Value repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    if (static_cast<double>(seq.str().size()) * static_cast<double>(n) > 1e8)
      throw Failure("string repetition too large");
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::string(std::move(out), seq.is_markup());
  }
  if (static_cast<double>(seq.seq().items.size()) * static_cast<double>(n) > 1e7)
    throw Failure("list repetition too large");
  std::vector<Value> items;
  for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq.seq().items.begin(), seq.seq().items.end());
  return Value::seq(std::move(items), seq.seq().kind);
}

Value mul(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type() != Type::kFloat && b.type() != Type::kFloat) {
      return Value::integer(checked_mul(a.number_as_int(), b.number_as_int()));
    }
    return Value::floating(a.number_as_double() * b.number_as_double());
  }
  auto repeatable = [](const Value& v) { return v.is_string() || v.is_list_or_tuple(); };
  if (repeatable(a) && is_int_like(b)) return repeat(a, b.number_as_int());
  if (is_int_like(a) && repeatable(b)) return repeat(b, a.number_as_int());
  unsupported_operands("*", a, b);
}

// Python's float floor division and modulo (Objects/floatobject.c float_divmod).
void float_divmod(double vx, double wx, double* floordiv, double* mod) {
  double m = std::fmod(vx, wx);
  double div = (vx - m) / wx;
  if (m != 0.0) {
    if ((wx < 0) != (m < 0)) {
      m += wx;
      div -= 1.0;
    }
  } else {
    m = std::copysign(0.0, wx);
  }
  double fd;
  if (div != 0.0) {
    fd = std::floor(div);
    if (div - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, vx / wx);
  }
  *floordiv = fd;
  *mod = m;
}

Value divide(BinOp op, const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) {
    if (op == BinOp::kMod && a.is_string()) {
      if (a.is_markup()) throw Failure("'%' on a |safe or |escape string is not supported");
      if (b.is_seq(SeqKind::kTuple)) return Value::string(printf_format(a.str(), b.seq().items, nullptr));
      // Python takes a right operand with __getitem__ (but not a str) as a mapping for %(name)s.
      const bool mapping = b.is_dict() || b.is_list_or_tuple() || b.is_seq(SeqKind::kRange) || b.is_undefined();
      return Value::string(printf_format(a.str(), {b}, mapping ? &b : nullptr));
    }
    unsupported_operands(op == BinOp::kDiv ? "/" : op == BinOp::kFloorDiv ? "//" : "%", a, b);
  }
  const bool ints = a.type() != Type::kFloat && b.type() != Type::kFloat;
  if (op == BinOp::kDiv) {
    if (b.number_as_double() == 0.0) throw Failure("division by zero");
    return Value::floating(a.number_as_double() / b.number_as_double());
  }
  if (ints) {
    const int64_t x = a.number_as_int(), y = b.number_as_int();
    if (y == 0) throw Failure("integer division or modulo by zero");
    if (y == -1) return Value::integer(op == BinOp::kMod ? 0 : checked_mul(x, -1));
    int64_t q = x / y, r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {
      q -= 1;
      r += y;
    }
    return Value::integer(op == BinOp::kMod ? r : q);
  }
  if (b.number_as_double() == 0.0) throw Failure(op == BinOp::kMod ? "float modulo" : "float floor division by zero");
  double fd, m;
  float_divmod(a.number_as_double(), b.number_as_double(), &fd, &m);
  return Value::floating(op == BinOp::kMod ? m : fd);
}

Value power(const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) unsupported_operands("** or pow()", a, b);
  if (a.type() != Type::kFloat && b.type() != Type::kFloat && b.number_as_int() >= 0) {
    int64_t base = a.number_as_int(), exp = b.number_as_int(), result = 1;
    while (exp > 0) {
      if (exp & 1) result = checked_mul(result, base);
      exp >>= 1;
      if (exp > 0) base = checked_mul(base, base);
    }
    return Value::integer(result);
  }
  const double x = a.number_as_double(), y = b.number_as_double();
  if (x == 0.0 && y < 0) throw Failure("0.0 cannot be raised to a negative power");
  if (x < 0 && y != std::floor(y)) throw Failure("a negative number to a fractional power is complex (not supported)");
  const double r = std::pow(x, y);
  if (std::isinf(r) && !std::isinf(x) && !std::isinf(y)) throw Failure("(34, 'Numerical result out of range')");
  return Value::floating(r);
}

// Python's slice.indices(length): the positions a slice selects.
std::vector<int64_t> slice_positions(int64_t length, const Value& start, const Value& stop, const Value& step) {
  const int64_t st = step.is_none() ? 1 : step.number_as_int();
  if (st == 0) throw Failure("slice step cannot be zero");
  const int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? length : length - 1;
  auto clamp = [&](const Value& v, int64_t fallback) {
    if (v.is_none()) return fallback;
    int64_t i = v.number_as_int();
    if (i < 0) {
      i += length;
      if (i < lower) i = lower;
    } else if (i > upper) {
      i = upper;
    }
    return i;
  };
  const int64_t b = clamp(start, st > 0 ? lower : upper), e = clamp(stop, st > 0 ? upper : lower);
  std::vector<int64_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(i);
  return out;
}

// jinja2 compiles a[b:c] to a plain Python subscript (no sandbox getitem), so errors propagate.
Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  const bool sliceable = obj.is_string() || obj.is_list_or_tuple() || obj.is_seq(SeqKind::kRange);
  if (!sliceable) {
    if (obj.is_dict()) throw Failure("unhashable type: 'slice'");
    throw Failure(py_repr_string(type_name(obj)) + " object is not subscriptable");
  }
  for (const Value* v : {&start, &stop, &step}) {
    if (!v->is_none() && !is_int_like(*v)) {
      throw Failure("slice indices must be integers or None or have an __index__ method");
    }
  }
  if (obj.is_string()) {
    if (obj.is_markup()) throw Failure("slicing a |safe or |escape string is not supported");
    const std::string& s = obj.str();
    std::vector<size_t> offsets;  // of each code point, and the end
    for (size_t pos = 0; pos < s.size();) {
      offsets.push_back(pos);
      utf8_next(s, &pos);
    }
    offsets.push_back(s.size());
    const auto n = static_cast<int64_t>(offsets.size() - 1);
    std::string out;
    for (int64_t i : slice_positions(n, start, stop, step)) out.append(s, offsets[i], offsets[i + 1] - offsets[i]);
    return Value::string(std::move(out));
  }
  const SeqObj& seq = obj.seq();
  const std::vector<int64_t> positions = slice_positions(static_cast<int64_t>(seq.items.size()), start, stop, step);
  std::vector<Value> items;
  for (int64_t i : positions) items.push_back(seq.items[i]);
  Value out = Value::seq(std::move(items), seq.kind);
  if (seq.kind == SeqKind::kRange) {
    auto& r = const_cast<SeqObj&>(out.seq());
    const int64_t st = step.is_none() ? 1 : step.number_as_int();
    const int64_t first = positions.empty() ? 0 : positions.front();
    r.range_step = seq.range_step * st;
    r.range_start = seq.range_start + first * seq.range_step;
    r.range_stop = r.range_start + static_cast<int64_t>(positions.size()) * r.range_step;
  }
  return out;
}

}  // namespace

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Value binary_op(BinOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  switch (op) {
    case BinOp::kAdd:
      return add(a, b);
    case BinOp::kSub:
      if (!a.is_number() || !b.is_number()) unsupported_operands("-", a, b);
      if (a.type() != Type::kFloat && b.type() != Type::kFloat) {
        if (b.number_as_int() == INT64_MIN) throw Failure("integer overflow (not supported)");
        return Value::integer(checked_add(a.number_as_int(), -b.number_as_int()));
      }
      return Value::floating(a.number_as_double() - b.number_as_double());
    case BinOp::kMul:
      return mul(a, b);
    case BinOp::kPow:
      return power(a, b);
    default:
      return divide(op, a, b);
  }
}

Value Interp::eval(const Expr& e) {
  // Expressions and the macro calls inside them recurse: a bounded stack on any thread.
  if (++nest_ > 4 * ast_.limits.max_depth) {
    --nest_;
    throw Failure(over_limit("the template's expressions and macro calls nest deeper than", 4 * ast_.limits.max_depth,
                             "data.chat_template_max_depth (4 times it)"));
  }
  struct Leave {
    int& n;
    ~Leave() { --n; }
  } leave{nest_};
  return eval_node(e);
}

Value Interp::eval_node(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName:
      return lookup(e.symbol);
    case ExprKind::kGetAttr: {
      const Value obj = eval(*e.children[0]);
      line = e.line;
      return get_attr(obj, e.name_value);
    }
    case ExprKind::kGetItem:
      return eval_item(e);
    case ExprKind::kCall:
      return eval_call(e);
    case ExprKind::kFilter: {
      Value input = eval(*e.children[0]);
      line = e.line;
      return apply_filter(*this, e, std::move(input));
    }
    case ExprKind::kTest: {
      const Value subject = eval(*e.children[0]);
      line = e.line;
      return Value::boolean(apply_test(*this, e, subject));
    }
    case ExprKind::kNot:
      return Value::boolean(!truthy(eval(*e.children[0])));
    case ExprKind::kNeg:
    case ExprKind::kPos:
      return eval_unary(e, eval(*e.children[0]));
    case ExprKind::kBinary: {
      const Value a = eval(*e.children[0]);
      const Value b = eval(*e.children[1]);
      line = e.line;
      return binary_op(e.bin_op, a, b);
    }
    case ExprKind::kCompare:
      return eval_compare(e);
    case ExprKind::kAnd: {
      Value a = eval(*e.children[0]);
      return truthy(a) ? eval(*e.children[1]) : a;
    }
    case ExprKind::kOr: {
      Value a = eval(*e.children[0]);
      return truthy(a) ? a : eval(*e.children[1]);
    }
    case ExprKind::kCond:
      if (truthy(eval(*e.children[0]))) return eval(*e.children[1]);
      if (e.children[2]) return eval(*e.children[2]);
      return Value::undefined_hint("the inline if-expression on line " + std::to_string(e.line) +
                                   " evaluated to false and no else section was defined.");
    case ExprKind::kConcat: {
      std::string out;
      for (const ExprPtr& c : e.children) append_py_str(out, eval(*c));
      return Value::string(std::move(out));
    }
    case ExprKind::kSlice:
      throw Failure("a slice is only supported directly inside [...]");
    default:
      return eval_collection(e);
  }
}

Value Interp::eval_collection(const Expr& e) {
  if (e.kind == ExprKind::kDict) {
    DictObj d;
    for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
      Value k = eval(*e.children[i]);
      Value v = eval(*e.children[i + 1]);
      line = e.line;
      d.set(std::move(k), std::move(v));
    }
    return Value::dict(std::move(d));
  }
  std::vector<Value> items;
  items.reserve(e.children.size());
  for (const ExprPtr& c : e.children) items.push_back(eval(*c));
  return Value::seq(std::move(items), e.kind == ExprKind::kTuple ? SeqKind::kTuple : SeqKind::kList);
}

Value Interp::eval_unary(const Expr& e, const Value& v) {
  line = e.line;
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) {
    throw Failure(std::string("bad operand type for unary ") + (e.kind == ExprKind::kNeg ? "-" : "+") + ": " +
                  py_repr_string(type_name(v)));
  }
  if (v.type() == Type::kFloat) return Value::floating(e.kind == ExprKind::kNeg ? -v.as_float() : v.as_float());
  if (e.kind == ExprKind::kPos) return Value::integer(v.number_as_int());
  if (v.number_as_int() == INT64_MIN) throw Failure("integer overflow (not supported)");
  return Value::integer(-v.number_as_int());
}

Value Interp::eval_compare(const Expr& e) {
  Value left = eval(*e.children[0]);
  for (size_t i = 0; i < e.cmp_ops.size(); ++i) {
    Value right = eval(*e.children[i + 1]);
    line = e.line;
    bool ok;
    switch (e.cmp_ops[i]) {
      case CmpOp::kEq:
        ok = py_equal(left, right);
        break;
      case CmpOp::kNe:
        ok = !py_equal(left, right);
        break;
      case CmpOp::kIn:
        ok = py_contains(right, left);
        break;
      case CmpOp::kNotIn:
        ok = !py_contains(right, left);
        break;
      case CmpOp::kLt:
        ok = py_compare(left, right, "<") == -1;
        break;
      case CmpOp::kLe: {
        const int c = py_compare(left, right, "<=");
        ok = c == -1 || c == 0;
        break;
      }
      case CmpOp::kGt:
        ok = py_compare(left, right, ">") == 1;
        break;
      case CmpOp::kGe: {
        const int c = py_compare(left, right, ">=");
        ok = c == 1 || c == 0;
        break;
      }
    }
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interp::eval_item(const Expr& e) {
  const Value obj = eval(*e.children[0]);
  const Expr& key = *e.children[1];
  if (key.kind != ExprKind::kSlice) {
    const Value k = eval(key);
    line = e.line;
    return get_item(obj, k);
  }
  Value parts[3];
  for (int i = 0; i < 3; ++i) parts[i] = key.children[i] ? eval(*key.children[i]) : Value::none();
  line = e.line;
  if (folding) {  // jinja2 folds constants through the sandbox's getitem: a TypeError gives Undefined
    const bool sliceable = obj.is_string() || obj.is_list_or_tuple() || obj.is_seq(SeqKind::kRange);
    const bool int_bounds = std::all_of(parts, parts + 3, [](const Value& v) { return v.is_none() || is_int_like(v); });
    if (!sliceable || !int_bounds) return Value::undefined_hint(type_name(obj) + " object cannot be sliced");
  }
  if (obj.is_undefined()) fail_undefined(obj);
  return slice_value(obj, parts[0], parts[1], parts[2]);
}

CallArgs Interp::eval_args(const Expr& node) {
  CallArgs args;
  args.positional.reserve(node.children.size() - 1);
  for (size_t i = 1; i < node.children.size(); ++i) args.positional.push_back(eval(*node.children[i]));
  for (const auto& [name, value] : node.kwargs) args.keyword.emplace_back(name, eval(*value));
  line = node.line;
  return args;
}

Value Interp::eval_call(const Expr& e) {
  const Value callee = eval(*e.children[0]);
  CallArgs args = eval_args(e);
  return call(callee, args);
}

Value Interp::call(const Value& callee, CallArgs& args) {
  if (callee.type() == Type::kCallable) return callee.callable().call(*this, args);
  if (callee.is_undefined()) fail_undefined(callee);
  throw Failure(py_repr_string(type_name(callee)) + " object is not callable");
}

Value Interp::get_attr(const Value& obj, const Value& name) {
  const std::string& n = name.str();
  if (obj.is_undefined()) fail_undefined(obj);
  if (n.size() > 1 && n[0] == '_' && n[1] == '_') {
    return Value::undefined_hint(
        "access to attribute " + py_repr_string(n) + " of " + py_repr_string(type_name(obj)) + " object is unsafe.",
        true);
  }
  if (obj.type() == Type::kNamespace) {
    if (const Value* v = obj.ns().attrs.find(std::string_view(n))) return *v;
    return Value::undefined_attr(obj, name);
  }
  bool found = false;
  Value attr = builtin_attr(obj, n, &found);
  if (found) return attr;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(std::string_view(n))) return *v;
  }
  return Value::undefined_attr(obj, name);
}

Value Interp::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict() && is_hashable(key)) {
    if (const Value* v = obj.dict().find(key)) return *v;
  } else if ((obj.is_list_or_tuple() || obj.is_seq(SeqKind::kRange)) && is_int_like(key)) {
    const auto& items = obj.seq().items;
    int64_t i = key.number_as_int();
    if (i < 0) i += static_cast<int64_t>(items.size());
    if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[i];
  } else if (obj.is_string() && is_int_like(key)) {
    if (obj.is_markup()) throw Failure("indexing a |safe or |escape string is not supported");
    const std::string& s = obj.str();
    int64_t i = key.number_as_int();
    const auto n = static_cast<int64_t>(utf8_length(s));
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      size_t pos = utf8_offset(s, static_cast<size_t>(i));
      const size_t start = pos;
      utf8_next(s, &pos);
      return Value::string(s.substr(start, pos - start));
    }
  }
  if (key.is_string()) {
    if (obj.type() == Type::kNamespace) {
      if (const Value* v = obj.ns().attrs.find(std::string_view(key.str()))) return *v;
    } else if (key.str().rfind("__", 0) != 0) {
      bool found = false;
      Value attr = builtin_attr(obj, key.str(), &found);
      if (found) return attr;
    }
  }
  return Value::undefined_attr(obj, key);
}

}  // namespace fsdp::chat::jinja

// jinja2's built-in tests (jinja2/tests.py): `x is defined`, `x is divisibleby 3`, ...
#include "chat/jinja_interp.h"
#include "chat/jinja_unicode.h"

namespace fsdp::chat::jinja {

enum class TestId : uint8_t {
  kOdd,
  kEven,
  kDivisibleby,
  kDefined,
  kUndefined,
  kFilter,
  kTest,
  kNone,
  kBoolean,
  kFalse,
  kTrue,
  kInteger,
  kFloat,
  kLower,
  kUpper,
  kString,
  kMapping,
  kNumber,
  kSequence,
  kIterable,
  kCallable,
  kSameas,
  kEscaped,
  kIn,
  kEq,
  kNe,
  kGt,
  kGe,
  kLt,
  kLe,
};

namespace {

struct TestName {
  const char* name;
  TestId id;
};
const TestName kTests[] = {
    {"odd", TestId::kOdd},
    {"even", TestId::kEven},
    {"divisibleby", TestId::kDivisibleby},
    {"defined", TestId::kDefined},
    {"undefined", TestId::kUndefined},
    {"filter", TestId::kFilter},
    {"test", TestId::kTest},
    {"none", TestId::kNone},
    {"boolean", TestId::kBoolean},
    {"false", TestId::kFalse},
    {"true", TestId::kTrue},
    {"integer", TestId::kInteger},
    {"float", TestId::kFloat},
    {"lower", TestId::kLower},
    {"upper", TestId::kUpper},
    {"string", TestId::kString},
    {"mapping", TestId::kMapping},
    {"number", TestId::kNumber},
    {"sequence", TestId::kSequence},
    {"iterable", TestId::kIterable},
    {"callable", TestId::kCallable},
    {"sameas", TestId::kSameas},
    {"escaped", TestId::kEscaped},
    {"in", TestId::kIn},
    {"==", TestId::kEq},
    {"eq", TestId::kEq},
    {"equalto", TestId::kEq},
    {"!=", TestId::kNe},
    {"ne", TestId::kNe},
    {">", TestId::kGt},
    {"gt", TestId::kGt},
    {"greaterthan", TestId::kGt},
    {"ge", TestId::kGe},
    {">=", TestId::kGe},
    {"<", TestId::kLt},
    {"lt", TestId::kLt},
    {"lessthan", TestId::kLt},
    {"<=", TestId::kLe},
    {"le", TestId::kLe},
};

bool compare_test(TestId id, const Value& v, const Value& other) {
  switch (id) {
    case TestId::kEq:
      return py_equal(v, other);
    case TestId::kNe:
      return !py_equal(v, other);
    case TestId::kGt:
      return py_compare(v, other, ">") == 1;
    case TestId::kLt:
      return py_compare(v, other, "<") == -1;
    case TestId::kGe: {
      const int c = py_compare(v, other, ">=");
      return c == 1 || c == 0;
    }
    default: {
      const int c = py_compare(v, other, "<=");
      return c == -1 || c == 0;
    }
  }
}

}  // namespace

bool run_test(Interp& /*interp*/, TestId id, const Value& v, const CallArgs& args) {
  auto one_arg = [&](const char* name) -> const Value& {
    const Value* a = find_arg(args, 0, name);
    if (a == nullptr || args.positional.size() + args.keyword.size() != 1) {
      throw Failure(std::string("the test takes one argument (") + name + ")");
    }
    return *a;
  };
  if (id != TestId::kDivisibleby && id != TestId::kIn && id != TestId::kSameas && id < TestId::kEq &&
      !(args.positional.empty() && args.keyword.empty())) {
    throw Failure("the test takes no arguments");
  }
  switch (id) {
    case TestId::kOdd:
    case TestId::kEven:
      return py_equal(binary_op(BinOp::kMod, v, Value::integer(2)), Value::integer(id == TestId::kOdd ? 1 : 0));
    case TestId::kDivisibleby:
      return py_equal(binary_op(BinOp::kMod, v, one_arg("num")), Value::integer(0));
    case TestId::kDefined:
      return !v.is_undefined();
    case TestId::kUndefined:
      return v.is_undefined();
    case TestId::kFilter:
    case TestId::kTest: {
      if (!v.is_string()) return false;
      FilterId f;
      TestId t;
      return id == TestId::kFilter ? find_filter(v.str(), &f) != Lookup::kUnknown
                                   : find_test(v.str(), &t) != Lookup::kUnknown;
    }
    case TestId::kNone:
      return v.is_none();
    case TestId::kBoolean:
      return v.type() == Type::kBool;
    case TestId::kFalse:
      return v.type() == Type::kBool && !v.as_bool();
    case TestId::kTrue:
      return v.type() == Type::kBool && v.as_bool();
    case TestId::kInteger:
      return v.type() == Type::kInt;
    case TestId::kFloat:
      return v.type() == Type::kFloat;
    case TestId::kNumber:
      return v.is_number();
    case TestId::kLower:
      return py_islower(py_str(v));
    case TestId::kUpper:
      return py_isupper(py_str(v));
    case TestId::kString:
      return v.is_string();
    case TestId::kMapping:
      return v.is_dict();
    case TestId::kSequence:
      return v.is_string() || v.is_dict() || v.is_undefined() || v.is_list_or_tuple() || v.is_seq(SeqKind::kRange);
    case TestId::kIterable:
      return v.is_string() || v.is_dict() || v.is_undefined() || v.is_seq() || v.type() == Type::kLoop;
    case TestId::kCallable:
      return v.type() == Type::kCallable || v.is_undefined();
    case TestId::kEscaped:
      return v.is_markup();
    case TestId::kIn:
      return py_contains(one_arg("seq"), v);
    case TestId::kSameas: {
      const Value& other = one_arg("other");
      if (v.is_none() || other.is_none() || v.type() == Type::kBool || other.type() == Type::kBool) {
        return v.type() == other.type() && (v.is_none() || v.as_bool() == other.as_bool());
      }
      if (v.is_number() || other.is_number()) throw Failure("'sameas' on numbers is not supported");
      return v.type() == other.type() && v.object_ptr() == other.object_ptr();
    }
    default:
      return compare_test(id, v, one_arg("other"));
  }
}

Lookup find_test(std::string_view name, TestId* id) {
  for (const TestName& t : kTests) {
    if (name == t.name) {
      *id = t.id;
      return Lookup::kSupported;
    }
  }
  return Lookup::kUnknown;
}

bool apply_test(Interp& interp, const Expr& test, const Value& subject) {
  const CallArgs args = interp.eval_args(test);
  if (test.lookup == Lookup::kUnknown) throw Failure("No test named '" + test.name + "' found.");
  if (test.lookup == Lookup::kUnsupported) throw Failure("the test '" + test.name + "' is not supported");
  return run_test(interp, test.test, subject, args);
}

}  // namespace fsdp::chat::jinja

// The parsed form of a template (jinja2's nodes, reduced to what chat templates use), the lexer and
// parser that build it, and the filter/test tables the parser resolves names against. Internal to
// lib/chat. A TemplateAst is immutable after parse_template returns; renders share it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja_value.h"
#include "chat/template_limits.h"

namespace fsdp::chat::jinja {

// ---- Tokens (jinja2's lexer with trim_blocks and lstrip_blocks) ----

enum class Tok : uint8_t { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  int line;
  std::string text;  // data, name, decoded string, operator
  int64_t int_value = 0;
  double float_value = 0;
};

// Throws fsdp::InputError "WHERE:LINE: ..." for what jinja2's lexer rejects.
std::vector<Token> lex_template(std::string_view source, const std::string& where);

// ---- Expressions ----

enum class ExprKind : uint8_t {
  kConst,
  kName,
  kGetAttr,  // children[0].name
  kGetItem,  // children[0][children[1]]; children[1] may be a kSlice
  kSlice,    // children: start, stop, step (each may be null)
  kCall,     // children[0](children[1..], kwargs)
  kFilter,   // children[0] (null in filter blocks) | name(children[1..], kwargs)
  kTest,     // children[0] is name(children[1..], kwargs)
  kNeg,
  kPos,
  kNot,
  kBinary,   // children[0] op children[1]
  kCompare,  // children[0] cmp_ops[0] children[1] cmp_ops[1] children[2] ...
  kAnd,
  kOr,
  kCond,    // children: test, then, else (may be null)
  kConcat,  // children joined with ~
  kList,
  kTuple,
  kDict,  // children: key, value, key, value, ...
};

enum class BinOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CmpOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

enum class FilterId : uint8_t;
enum class TestId : uint8_t;
enum class Lookup : uint8_t { kSupported, kUnsupported, kUnknown };

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;       // kConst
  int symbol = -1;   // kName
  std::string name;  // kName, kGetAttr (the attribute), kFilter, kTest
  Value name_value;  // kGetAttr: the attribute as a string Value
  BinOp bin_op = BinOp::kAdd;
  FilterId filter{};
  TestId test{};
  // kFilter, kTest: an unknown or unsupported name fails when the node runs. Outside {% if %} and
  // conditional expressions the parser refuses it already, as jinja2's compiler does.
  Lookup lookup = Lookup::kSupported;
  std::vector<CmpOp> cmp_ops;
  std::vector<std::unique_ptr<Expr>> children;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
};
using ExprPtr = std::unique_ptr<Expr>;

// ---- Statements ----

// What `set`, `for` and `with` assign to: a name, a tuple to unpack, or a namespace attribute.
struct Target {
  enum class Kind : uint8_t { kName, kTuple, kNsAttr } kind = Kind::kName;
  int symbol = -1;
  std::string name;  // kName, kNsAttr (the namespace variable)
  std::string attr;  // kNsAttr
  std::vector<Target> items;
};

struct Stmt;
// A statement list run in one jinja2 frame. `missing` lists the variables the frame assigns that
// jinja2 reads as undefined until then, even where an outer scope or the caller has them.
struct Body {
  std::vector<Stmt> stmts;
  std::vector<int> missing;
};

struct MacroDef {
  std::string name;
  int symbol = -1;
  std::vector<int> params;
  std::vector<std::string> param_names;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  bool uses_varargs = false, uses_kwargs = false;
};

enum class StmtKind : uint8_t {
  kText,
  kOutput,       // exprs, printed in turn
  kIf,           // exprs: conditions; bodies: one per condition, then the else body if any
  kFor,          // target in exprs[0] [if exprs[1]]; bodies[0], bodies[1] = else
  kSet,          // target = exprs[0]
  kSetBlock,     // target = bodies[0] rendered [| exprs[0] filter chain]
  kMacro,        // macro
  kGeneration,   // bodies[0], rendered as a caller block; its output span is recorded
  kFilterBlock,  // bodies[0] rendered, through exprs[0] filter chain
  kWith,         // targets = exprs; bodies[0]
  kBreak,
  kContinue,
};

struct Stmt {
  Stmt(StmtKind k, int l) : kind(k), line(l) {}
  StmtKind kind;
  int line = 0;
  std::string text;  // kText
  std::vector<ExprPtr> exprs;
  std::vector<Body> bodies;
  std::vector<Target> targets;  // kSet, kSetBlock, kFor: one; kWith: several
  bool has_else = false;        // kIf, kFor
  std::shared_ptr<MacroDef> macro;
};

struct TemplateAst {
  std::string where;
  TemplateLimits limits;
  Body root;
  std::vector<std::string> symbols;  // symbol id -> name
  int loop_symbol = -1, varargs_symbol = -1, kwargs_symbol = -1;
};

// Throws fsdp::InputError "WHERE:LINE: ..." for a syntax error, a construct the engine refuses, or
// nesting deeper than limits.max_depth (the parser and every pass over the tree recurse).
std::unique_ptr<TemplateAst> parse_template(std::string_view source, const std::string& where,
                                            const TemplateLimits& limits);


// ---- Filters and tests (jinja_filters.cpp) ----

// Finds a filter or test by name; kUnsupported: jinja2 has it, this engine refuses it.
Lookup find_filter(std::string_view name, FilterId* id);
Lookup find_test(std::string_view name, TestId* id);

}  // namespace fsdp::chat::jinja

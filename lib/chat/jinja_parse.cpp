// jinja2's parser (jinja2/parser.py) for the statements and expressions chat templates use, with
// the loopcontrols extension and transformers' {% generation %} tag. Constructs the engine does not
// implement are refused here, naming the line, so nothing is rendered half-understood.
#include <map>
#include <set>
#include <unordered_map>

#include "chat/jinja_ast.h"
#include "util/error.h"

namespace fsdp::chat::jinja {
namespace {

using Names = std::vector<const char*>;

class Parser {
 public:
  Parser(std::vector<Token> tokens, TemplateAst& ast) : toks_(std::move(tokens)), ast_(ast) {}

  Body parse_root() {
    Body body;
    body.stmts = subparse({});
    if (cur().type != Tok::kEof) fail("unexpected tag");
    return body;
  }

 private:
  // ---- Token stream ----
  const Token& cur() const { return toks_[i_]; }
  const Token& look() const { return toks_[std::min(i_ + 1, toks_.size() - 1)]; }
  void next() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  bool is_name(const char* v) const { return cur().type == Tok::kName && cur().text == v; }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool skip_name(const char* v) {
    if (!is_name(v)) return false;
    next();
    return true;
  }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kName:
      case Tok::kOp:
        return t.text;
      case Tok::kString:
        return "string";
      case Tok::kInt:
        return "integer";
      case Tok::kFloat:
        return "float";
      case Tok::kData:
        return "template data / text";
      case Tok::kVarBegin:
        return "begin of print statement";
      case Tok::kVarEnd:
        return "end of print statement";
      case Tok::kBlockBegin:
        return "begin of statement block";
      case Tok::kBlockEnd:
        return "end of statement block";
      case Tok::kEof:
        return "end of template";
    }
    return "token";
  }
  [[noreturn]] void fail(const std::string& what, int line = -1) const {
    throw InputError(str(ast_.where, ":", line < 0 ? cur().line : line, ": ", what));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(str("expected token '", op, "', got '", describe(cur()), "'"));
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) fail(str("expected ", what, ", got '", describe(cur()), "'"));
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail(str("expected name, got '", describe(cur()), "'"));
    std::string v = cur().text;
    next();
    return v;
  }
  bool cur_in(const Names& names) const {
    if (cur().type != Tok::kName) return false;
    for (const char* n : names) {
      if (cur().text == n) return true;
    }
    return false;
  }

  int intern(const std::string& name) {
    auto it = symbol_ids_.find(name);
    if (it != symbol_ids_.end()) return it->second;
    const int id = static_cast<int>(ast_.symbols.size());
    ast_.symbols.push_back(name);
    symbol_ids_.emplace(name, id);
    return id;
  }

  ExprPtr node(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  // A two-operand node of `kind` (with `op` for kBinary) over `left` and `right`.
  ExprPtr binary(ExprKind kind, int line, ExprPtr left, ExprPtr right, BinOp op = BinOp::kAdd) {
    ExprPtr e = node(kind, line);
    e->bin_op = op;
    e->children.push_back(std::move(left));
    e->children.push_back(std::move(right));
    return e;
  }

  // ---- Statements ----
  std::vector<Stmt> subparse(const Names& end_tokens);
  std::vector<Stmt> parse_statements(const Names& end_tokens, bool drop_needle);
  Body parse_body(const Names& end_tokens, bool drop_needle) {
    Body b;
    b.stmts = parse_statements(end_tokens, drop_needle);
    return b;
  }
  void parse_statement(std::vector<Stmt>& out);
  Stmt parse_for(int line);
  Stmt parse_if(int line);
  Stmt parse_set(int line);
  Stmt parse_macro(int line);
  Stmt parse_with(int line);
  Stmt parse_filter_block(int line);
  Target parse_assign_target(bool name_only, const Names& extra_end_rules, bool with_namespace);
  Target parse_target_primary(bool with_namespace);

  // ---- Expressions (jinja2's precedence) ----
  ExprPtr parse_expression(bool with_condexpr = true) { return with_condexpr ? parse_condexpr() : parse_or(); }
  ExprPtr parse_condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter = true);
  ExprPtr parse_primary();
  ExprPtr parse_tuple(bool with_condexpr, const Names& extra_end_rules, bool explicit_parentheses);
  ExprPtr parse_list();
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_filter_expr(ExprPtr e);
  ExprPtr parse_subscript(ExprPtr e);
  ExprPtr parse_subscribed();
  void parse_call_args(Expr& call);
  ExprPtr parse_filter(ExprPtr e, bool start_inline);
  ExprPtr parse_test(ExprPtr e);
  bool is_tuple_end(const Names& extra_end_rules) const {
    if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || is_op(")")) return true;
    return cur_in(extra_end_rules);
  }

  // The depth of the tree being built, bounded by limits.max_depth: the parser and every pass over
  // the tree (constant folding, scopes, rendering, the destructors) recurse once a level. A guard
  // holds a level for a recursive step (`enter` at construction) and one more for each time a loop
  // wraps what it built so far in a new node (a + b + c, x|f|g, a.b.c).
  class Depth {
   public:
    explicit Depth(Parser& p, bool enter = true) : p_(p) {
      if (enter) wrap();
    }
    void wrap() {
      ++held_;
      if (++p_.nesting_ > p_.ast_.limits.max_depth)
        p_.fail(over_limit("the template nests deeper than", p_.ast_.limits.max_depth, "data.chat_template_max_depth"));
    }
    ~Depth() { p_.nesting_ -= held_; }
    Depth(const Depth&) = delete;
    Depth& operator=(const Depth&) = delete;

   private:
    Parser& p_;
    int held_ = 0;
  };

  std::vector<Token> toks_;
  size_t i_ = 0;
  int nesting_ = 0;
  TemplateAst& ast_;
  std::unordered_map<std::string, int> symbol_ids_;
  int loop_depth_ = 0;  // for loops around the current statement, within the current macro
};

std::vector<Stmt> Parser::subparse(const Names& end_tokens) {
  std::vector<Stmt> body;
  while (cur().type != Tok::kEof) {
    const Token& t = cur();
    if (t.type == Tok::kData) {
      Stmt s{StmtKind::kText, t.line};
      s.text = t.text;
      body.push_back(std::move(s));
      next();
    } else if (t.type == Tok::kVarBegin) {
      next();
      Stmt s{StmtKind::kOutput, cur().line};
      s.exprs.push_back(parse_tuple(true, {}, false));
      expect(Tok::kVarEnd, "end of print statement");
      body.push_back(std::move(s));
    } else if (t.type == Tok::kBlockBegin) {
      next();
      if (cur_in(end_tokens)) return body;
      parse_statement(body);
      expect(Tok::kBlockEnd, "end of statement block");
    } else {
      fail(str("unexpected '", describe(t), "'"));
    }
  }
  return body;
}

std::vector<Stmt> Parser::parse_statements(const Names& end_tokens, bool drop_needle) {
  skip_op(":");
  expect(Tok::kBlockEnd, "end of statement block");
  std::vector<Stmt> body = subparse(end_tokens);
  if (cur().type == Tok::kEof) {
    std::string names;
    for (const char* n : end_tokens) names += (names.empty() ? "'" : " or '") + std::string(n) + "'";
    fail("unexpected end of template; jinja was looking for the following tags: " + names);
  }
  if (drop_needle) next();
  return body;
}

void Parser::parse_statement(std::vector<Stmt>& out) {
  const Depth depth(*this);
  if (cur().type != Tok::kName) fail("tag name expected");
  const std::string tag = cur().text;
  const int line = cur().line;
  if (tag == "for") {
    out.push_back(parse_for(line));
  } else if (tag == "if") {
    out.push_back(parse_if(line));
  } else if (tag == "set") {
    out.push_back(parse_set(line));
  } else if (tag == "macro") {
    out.push_back(parse_macro(line));
  } else if (tag == "with") {
    out.push_back(parse_with(line));
  } else if (tag == "filter") {
    out.push_back(parse_filter_block(line));
  } else if (tag == "print") {
    next();
    Stmt s{StmtKind::kOutput, line};
    while (cur().type != Tok::kBlockEnd) {
      if (!s.exprs.empty()) expect_op(",");
      s.exprs.push_back(parse_expression());
    }
    out.push_back(std::move(s));
  } else if (tag == "generation") {
    next();
    Stmt s{StmtKind::kGeneration, line};
    const int saved = loop_depth_;
    loop_depth_ = 0;  // the body is a caller macro: break/continue cannot reach an outer loop
    s.bodies.push_back(parse_body({"endgeneration"}, true));
    loop_depth_ = saved;
    out.push_back(std::move(s));
  } else if (tag == "break" || tag == "continue") {
    if (loop_depth_ == 0) fail(str("'", tag, "' outside of a for loop"));
    next();
    out.push_back(Stmt{tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, line});
  } else if (tag == "call" || tag == "block" || tag == "extends" || tag == "include" || tag == "import" ||
             tag == "from" || tag == "autoescape") {
    fail(str("the '", tag, "' tag is not supported"));
  } else {
    fail(str("encountered unknown tag '", tag, "'"));
  }
}

Stmt Parser::parse_for(int line) {
  next();
  Stmt s{StmtKind::kFor, line};
  s.targets.push_back(parse_assign_target(false, {"in"}, false));
  if (!skip_name("in")) fail(str("expected 'in', got '", describe(cur()), "'"));
  s.exprs.push_back(parse_tuple(false, {"recursive"}, false));
  if (skip_name("if")) {
    s.exprs.push_back(parse_expression());
  }
  if (is_name("recursive")) fail("recursive for loops are not supported");
  ++loop_depth_;
  s.bodies.push_back(parse_body({"endfor", "else"}, false));
  --loop_depth_;
  const bool has_else = cur().text == "else";
  next();
  if (has_else) {
    s.has_else = true;
    s.bodies.push_back(parse_body({"endfor"}, true));
  }
  return s;
}

Stmt Parser::parse_if(int line) {
  next();
  Stmt s{StmtKind::kIf, line};
  while (true) {
    s.exprs.push_back(parse_tuple(false, {}, false));
    s.bodies.push_back(parse_body({"elif", "else", "endif"}, false));
    const std::string end = cur().text;
    next();
    if (end == "elif") continue;
    if (end == "else") {
      s.has_else = true;
      s.bodies.push_back(parse_body({"endif"}, true));
    }
    return s;
  }
}

Stmt Parser::parse_set(int line) {
  next();
  Target target = parse_assign_target(false, {}, true);
  if (skip_op("=")) {
    Stmt s{StmtKind::kSet, line};
    s.targets.push_back(std::move(target));
    s.exprs.push_back(parse_tuple(true, {}, false));
    return s;
  }
  Stmt s{StmtKind::kSetBlock, line};
  s.targets.push_back(std::move(target));
  ExprPtr filter = parse_filter(nullptr, false);
  if (filter) s.exprs.push_back(std::move(filter));
  s.bodies.push_back(parse_body({"endset"}, true));
  return s;
}

Stmt Parser::parse_macro(int line) {
  next();
  auto macro = std::make_shared<MacroDef>();
  macro->name = expect_name();
  macro->symbol = intern(macro->name);
  expect_op("(");
  while (!is_op(")")) {
    if (!macro->params.empty()) expect_op(",");
    const std::string arg = expect_name();
    macro->param_names.push_back(arg);
    macro->params.push_back(intern(arg));
    if (skip_op("=")) {
      macro->defaults.push_back(parse_expression());
    } else if (!macro->defaults.empty()) {
      fail("non-default argument follows default argument");
    }
  }
  expect_op(")");
  const int saved = loop_depth_;
  loop_depth_ = 0;
  macro->body = parse_body({"endmacro"}, true);
  loop_depth_ = saved;
  Stmt s{StmtKind::kMacro, line};
  s.macro = std::move(macro);
  return s;
}

Stmt Parser::parse_with(int line) {
  next();
  Stmt s{StmtKind::kWith, line};
  while (cur().type != Tok::kBlockEnd) {
    if (!s.targets.empty()) expect_op(",");
    s.targets.push_back(parse_assign_target(false, {}, false));
    expect_op("=");
    s.exprs.push_back(parse_expression());
  }
  s.bodies.push_back(parse_body({"endwith"}, true));
  return s;
}

Stmt Parser::parse_filter_block(int line) {
  next();
  Stmt s{StmtKind::kFilterBlock, line};
  s.exprs.push_back(parse_filter(nullptr, true));
  s.bodies.push_back(parse_body({"endfilter"}, true));
  return s;
}

Target Parser::parse_assign_target(bool name_only, const Names& extra_end_rules, bool with_namespace) {
  if (name_only) {
    Target t;
    t.name = expect_name();
    t.symbol = intern(t.name);
    return t;
  }
  // parse_tuple(simplified=True): names (or ns.attr), possibly comma separated.
  Target tuple;
  tuple.kind = Target::Kind::kTuple;
  bool is_tuple = false;
  while (true) {
    if (!tuple.items.empty()) expect_op(",");
    if (is_tuple_end(extra_end_rules)) break;
    tuple.items.push_back(parse_target_primary(with_namespace));
    if (!is_op(",")) break;
    is_tuple = true;
  }
  if (!is_tuple) {
    if (tuple.items.empty()) fail(str("expected an expression, got '", describe(cur()), "'"));
    return std::move(tuple.items[0]);
  }
  return tuple;
}

Target Parser::parse_target_primary(bool with_namespace) {
  if (cur().type == Tok::kName) {
    const std::string name = cur().text;
    if (name == "true" || name == "false" || name == "True" || name == "False" || name == "none" || name == "None") {
      fail("can't assign to 'const'");
    }
    next();
    Target t;
    t.name = name;
    if (with_namespace && is_op(".")) {
      next();
      t.kind = Target::Kind::kNsAttr;
      t.attr = expect_name();
      t.symbol = intern(name);
      return t;
    }
    t.symbol = intern(name);
    return t;
  }
  if (skip_op("(")) {
    Target tuple;
    tuple.kind = Target::Kind::kTuple;
    while (!is_op(")")) {
      if (!tuple.items.empty()) expect_op(",");
      if (is_op(")")) break;
      tuple.items.push_back(parse_target_primary(false));
    }
    expect_op(")");
    return tuple;
  }
  fail(str("can't assign to '", describe(cur()), "'"));
}

// ---- Expressions ----

ExprPtr Parser::parse_condexpr() {
  int line = cur().line;
  ExprPtr expr1 = parse_or();
  Depth chain(*this, false);
  while (skip_name("if")) {
    chain.wrap();
    ExprPtr expr2 = parse_or();
    ExprPtr expr3 = skip_name("else") ? parse_condexpr() : nullptr;
    ExprPtr cond = node(ExprKind::kCond, line);
    cond->children.push_back(std::move(expr2));
    cond->children.push_back(std::move(expr1));
    cond->children.push_back(std::move(expr3));
    expr1 = std::move(cond);
    line = cur().line;
  }
  return expr1;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  Depth chain(*this, false);
  while (is_name("or")) {
    const int line = cur().line;
    next();
    chain.wrap();
    left = binary(ExprKind::kOr, line, std::move(left), parse_and());
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  Depth chain(*this, false);
  while (is_name("and")) {
    const int line = cur().line;
    next();
    chain.wrap();
    left = binary(ExprKind::kAnd, line, std::move(left), parse_not());
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    const Depth depth(*this);
    ExprPtr e = node(ExprKind::kNot, cur().line);
    next();
    e->children.push_back(parse_not());
    return e;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const int line = cur().line;
  ExprPtr expr = parse_math1();
  ExprPtr cmp;
  static const std::pair<const char*, CmpOp> kOps[] = {{"==", CmpOp::kEq}, {"!=", CmpOp::kNe}, {"<", CmpOp::kLt},
                                                       {"<=", CmpOp::kLe}, {">", CmpOp::kGt},  {">=", CmpOp::kGe}};
  while (true) {
    CmpOp op;
    bool found = false;
    for (const auto& [text, o] : kOps) {
      if (is_op(text)) {
        op = o;
        found = true;
        break;
      }
    }
    if (found) {
      next();
    } else if (is_name("in")) {
      next();
      op = CmpOp::kIn;
    } else if (is_name("not") && look().type == Tok::kName && look().text == "in") {
      next();
      next();
      op = CmpOp::kNotIn;
    } else {
      break;
    }
    if (!cmp) {
      cmp = node(ExprKind::kCompare, line);
      cmp->children.push_back(std::move(expr));
    }
    cmp->cmp_ops.push_back(op);
    cmp->children.push_back(parse_math1());
  }
  return cmp ? std::move(cmp) : std::move(expr);
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  Depth chain(*this, false);
  while (is_op("+") || is_op("-")) {
    chain.wrap();
    const int line = cur().line;
    const BinOp op = is_op("+") ? BinOp::kAdd : BinOp::kSub;
    next();
    left = binary(ExprKind::kBinary, line, std::move(left), parse_concat(), op);
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  const int line = cur().line;
  ExprPtr first = parse_math2();
  if (!is_op("~")) return first;
  ExprPtr e = node(ExprKind::kConcat, line);
  e->children.push_back(std::move(first));
  while (skip_op("~")) e->children.push_back(parse_math2());
  return e;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  Depth chain(*this, false);
  static const std::pair<const char*, BinOp> kOps[] = {
      {"*", BinOp::kMul}, {"/", BinOp::kDiv}, {"//", BinOp::kFloorDiv}, {"%", BinOp::kMod}};
  while (true) {
    const std::pair<const char*, BinOp>* match = nullptr;
    for (const auto& op : kOps) {
      if (is_op(op.first)) match = &op;
    }
    if (match == nullptr) return left;
    chain.wrap();
    const int line = cur().line;
    next();
    left = binary(ExprKind::kBinary, line, std::move(left), parse_pow(), match->second);
  }
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary();
  Depth chain(*this, false);
  while (is_op("**")) {
    chain.wrap();
    const int line = cur().line;
    next();
    left = binary(ExprKind::kBinary, line, std::move(left), parse_unary(), BinOp::kPow);
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  const Depth depth(*this);
  ExprPtr e;
  if (is_op("-") || is_op("+")) {
    e = node(is_op("-") ? ExprKind::kNeg : ExprKind::kPos, cur().line);
    next();
    e->children.push_back(parse_unary(false));
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  if (with_filter) e = parse_filter_expr(std::move(e));
  return e;
}

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  ExprPtr e = node(ExprKind::kConst, t.line);
  if (t.type == Tok::kName) {
    if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
      e->value = Value::boolean(t.text[0] == 't' || t.text[0] == 'T');
    } else if (t.text == "none" || t.text == "None") {
      e->value = Value::none();
    } else {
      e->kind = ExprKind::kName;
      e->name = t.text;
      e->symbol = intern(t.text);
    }
    next();
  } else if (t.type == Tok::kString) {
    std::string s;
    while (cur().type == Tok::kString) {
      s += cur().text;
      next();
    }
    e->value = Value::string(std::move(s));
  } else if (t.type == Tok::kInt || t.type == Tok::kFloat) {
    e->value = t.type == Tok::kInt ? Value::integer(t.int_value) : Value::floating(t.float_value);
    next();
  } else if (is_op("(")) {
    next();
    e = parse_tuple(true, {}, true);
    expect_op(")");
  } else if (is_op("[")) {
    e = parse_list();
  } else if (is_op("{")) {
    e = parse_dict();
  } else {
    fail(str("unexpected '", describe(t), "'"));
  }
  return e;
}

ExprPtr Parser::parse_tuple(bool with_condexpr, const Names& extra_end_rules, bool explicit_parentheses) {
  const int line = cur().line;
  std::vector<ExprPtr> args;
  bool is_tuple = false;
  while (true) {
    if (!args.empty()) expect_op(",");
    if (is_tuple_end(extra_end_rules)) break;
    args.push_back(parse_expression(with_condexpr));
    if (!is_op(",")) break;
    is_tuple = true;
  }
  if (!is_tuple) {
    if (!args.empty()) return std::move(args[0]);
    if (!explicit_parentheses) fail(str("expected an expression, got '", describe(cur()), "'"));
  }
  ExprPtr e = node(ExprKind::kTuple, line);
  e->children = std::move(args);
  return e;
}

ExprPtr Parser::parse_list() {
  ExprPtr e = node(ExprKind::kList, cur().line);
  expect_op("[");
  while (!is_op("]")) {
    if (!e->children.empty()) expect_op(",");
    if (is_op("]")) break;
    e->children.push_back(parse_expression());
  }
  expect_op("]");
  return e;
}

ExprPtr Parser::parse_dict() {
  ExprPtr e = node(ExprKind::kDict, cur().line);
  expect_op("{");
  while (!is_op("}")) {
    if (!e->children.empty()) expect_op(",");
    if (is_op("}")) break;
    e->children.push_back(parse_expression());
    expect_op(":");
    e->children.push_back(parse_expression());
  }
  expect_op("}");
  return e;
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  Depth chain(*this, false);
  while (true) {
    if (is_op(".") || is_op("[") || is_op("(")) chain.wrap();
    if (is_op(".") || is_op("[")) {
      e = parse_subscript(std::move(e));
    } else if (is_op("(")) {
      ExprPtr call = node(ExprKind::kCall, cur().line);
      call->children.push_back(std::move(e));
      parse_call_args(*call);
      e = std::move(call);
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr e) {
  Depth chain(*this, false);
  while (true) {
    if (is_op("|") || is_name("is") || is_op("(")) chain.wrap();
    if (is_op("|")) {
      e = parse_filter(std::move(e), false);
    } else if (is_name("is")) {
      e = parse_test(std::move(e));
    } else if (is_op("(")) {
      ExprPtr call = node(ExprKind::kCall, cur().line);
      call->children.push_back(std::move(e));
      parse_call_args(*call);
      e = std::move(call);
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr e) {
  const int line = cur().line;
  if (skip_op(".")) {
    const Token& attr = cur();
    if (attr.type == Tok::kName) {
      ExprPtr g = node(ExprKind::kGetAttr, line);
      g->name = attr.text;
      g->name_value = Value::string(attr.text);
      g->children.push_back(std::move(e));
      next();
      return g;
    }
    if (attr.type != Tok::kInt) fail("expected name or number");
    ExprPtr g = node(ExprKind::kGetItem, line);
    g->children.push_back(std::move(e));
    ExprPtr key = node(ExprKind::kConst, attr.line);
    key->value = Value::integer(attr.int_value);
    g->children.push_back(std::move(key));
    next();
    return g;
  }
  expect_op("[");
  std::vector<ExprPtr> args;
  while (!is_op("]")) {
    if (!args.empty()) expect_op(",");
    args.push_back(parse_subscribed());
  }
  expect_op("]");
  ExprPtr g = node(ExprKind::kGetItem, line);
  g->children.push_back(std::move(e));
  if (args.size() == 1) {
    g->children.push_back(std::move(args[0]));
  } else {
    ExprPtr t = node(ExprKind::kTuple, line);
    t->children = std::move(args);
    g->children.push_back(std::move(t));
  }
  return g;
}

ExprPtr Parser::parse_subscribed() {
  ExprPtr slice = node(ExprKind::kSlice, cur().line);
  if (skip_op(":")) {
    slice->children.push_back(nullptr);
  } else {
    ExprPtr e = parse_expression();
    if (!skip_op(":")) return e;
    slice->children.push_back(std::move(e));
  }
  if (is_op(":") || is_op("]") || is_op(",")) {
    slice->children.push_back(nullptr);
  } else {
    slice->children.push_back(parse_expression());
  }
  if (skip_op(":") && !is_op("]") && !is_op(",")) {
    slice->children.push_back(parse_expression());
  } else {
    slice->children.push_back(nullptr);
  }
  return slice;
}

void Parser::parse_call_args(Expr& call) {
  expect_op("(");
  bool require_comma = false;
  while (!is_op(")")) {
    if (require_comma) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
    if (cur().type == Tok::kName && look().type == Tok::kOp && look().text == "=") {
      std::string key = cur().text;
      next();
      next();
      call.kwargs.emplace_back(std::move(key), parse_expression());
    } else {
      if (!call.kwargs.empty()) fail("invalid syntax for function call expression");
      call.children.push_back(parse_expression());
    }
    require_comma = true;
  }
  expect_op(")");
}

ExprPtr Parser::parse_filter(ExprPtr e, bool start_inline) {
  Depth chain(*this, false);
  while (is_op("|") || start_inline) {
    chain.wrap();
    if (!start_inline) next();
    start_inline = false;
    const int line = cur().line;
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    ExprPtr f = node(ExprKind::kFilter, line);
    f->name = name;
    f->lookup = find_filter(name, &f->filter);
    f->children.push_back(std::move(e));
    if (is_op("(")) parse_call_args(*f);
    e = std::move(f);
  }
  return e;
}

ExprPtr Parser::parse_test(ExprPtr e) {
  const int line = cur().line;
  next();  // "is"
  const bool negated = skip_name("not");
  std::string name = expect_name();
  while (skip_op(".")) name += "." + expect_name();
  ExprPtr t = node(ExprKind::kTest, line);
  t->name = name;
  t->lookup = find_test(name, &t->test);
  t->children.push_back(std::move(e));
  const Tok type = cur().type;
  if (is_op("(")) {
    parse_call_args(*t);
  } else if ((type == Tok::kName || type == Tok::kString || type == Tok::kInt || type == Tok::kFloat || is_op("[") ||
              is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail("You cannot chain multiple tests with is");
    t->children.push_back(parse_postfix(parse_primary()));
  }
  if (!negated) return t;
  ExprPtr n = node(ExprKind::kNot, line);
  n->children.push_back(std::move(t));
  return n;
}

// jinja2's compiler fails on an unknown filter or test unless it sits in an {% if %} (its test or
// bodies) or a conditional expression, within the same frame: there it only fails if it runs. We
// treat filters and tests we do not support the same way.
class NameChecker {
 public:
  explicit NameChecker(const std::string& where) : where_(where) {}

  void body(const Body& b, bool soft) {
    for (const Stmt& s : b.stmts) stmt(s, soft);
  }

 private:
  void stmt(const Stmt& s, bool soft) {
    switch (s.kind) {
      case StmtKind::kIf:
        for (const ExprPtr& e : s.exprs) expr(e.get(), true);
        for (const Body& b : s.bodies) body(b, true);
        return;
      case StmtKind::kFor:
        expr(s.exprs[0].get(), soft);
        if (s.exprs.size() > 1) expr(s.exprs[1].get(), false);
        break;
      case StmtKind::kOutput:
      case StmtKind::kSet:
      case StmtKind::kWith:
        for (const ExprPtr& e : s.exprs) expr(e.get(), soft);
        break;
      case StmtKind::kSetBlock:
      case StmtKind::kFilterBlock:
        for (const ExprPtr& e : s.exprs) expr(e.get(), false);
        break;
      case StmtKind::kMacro:
        for (const ExprPtr& d : s.macro->defaults) expr(d.get(), false);
        body(s.macro->body, false);
        return;
      default:
        break;
    }
    for (const Body& b : s.bodies) body(b, false);  // loop, macro-like and block bodies are inner frames
  }

  void expr(const Expr* e, bool soft) {
    if (e == nullptr) return;
    if (e->kind == ExprKind::kCond) soft = true;
    if ((e->kind == ExprKind::kFilter || e->kind == ExprKind::kTest) && e->lookup != Lookup::kSupported && !soft) {
      const char* what = e->kind == ExprKind::kFilter ? "filter" : "test";
      if (e->lookup == Lookup::kUnknown)
        throw InputError(str(where_, ":", e->line, ": no ", what, " named '", e->name, "'"));
      throw InputError(str(where_, ":", e->line, ": the ", what, " '", e->name, "' is not supported"));
    }
    for (const ExprPtr& c : e->children) expr(c.get(), soft);
    for (const auto& kw : e->kwargs) expr(kw.second.get(), soft);
  }

  const std::string& where_;
};

}  // namespace

void analyze_frames(TemplateAst& ast);  // jinja_scope.cpp
void fold_constants(TemplateAst& ast);  // jinja_fold.cpp

std::unique_ptr<TemplateAst> parse_template(std::string_view source, const std::string& where,
                                            const TemplateLimits& limits) {
  auto ast = std::make_unique<TemplateAst>();
  ast->where = where;
  ast->limits = limits;
  Parser parser(lex_template(source, where), *ast);
  ast->root = parser.parse_root();
  NameChecker(where).body(ast->root, false);
  fold_constants(*ast);
  analyze_frames(*ast);
  return ast;
}

}  // namespace fsdp::chat::jinja

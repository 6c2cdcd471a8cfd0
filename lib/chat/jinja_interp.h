// The interpreter: one render of a parsed template, walking the AST. Internal to lib/chat. An
// Interp lives for one render call and is used by one thread; the TemplateAst it reads is shared.
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace fsdp::chat::jinja {

// What raise_exception(message) throws through the render.
struct Raised {
  std::string message;
  int line;
};

// One jinja2 frame's own variables; lookups continue in the parent (the enclosing frame, or for a
// macro the frame that defined it), then in the render variables and globals.
struct Scope {
  std::vector<std::pair<int, Value>> vars;
  std::shared_ptr<Scope> parent;
  bool ended = false;  // the frame has finished: its macros may no longer run

  Value* find(int symbol) {
    for (auto& kv : vars) {
      if (kv.first == symbol) return &kv.second;
    }
    return nullptr;
  }
  void set(int symbol, Value v) {
    if (Value* p = find(symbol)) {
      *p = std::move(v);
    } else {
      vars.emplace_back(symbol, std::move(v));
    }
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Interp {
 public:
  Interp(const TemplateAst& ast, const Json& variables, std::time_t now);
  // Breaks the reference cycles a render can make (a macro in the scope that is its closure, a
  // namespace holding itself, loop.changed(loop)) so nothing outlives the render.
  ~Interp();
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;

  using Spans = std::vector<std::pair<size_t, size_t>>;
  // Renders the template; `spans` and `char_spans` receive the spans of {% generation %} blocks,
  // in bytes and in code points.
  std::string render(Spans* spans, Spans* char_spans);

  // Throws Failure when expressions and macro calls nest past 4 x limits.max_depth.
  Value eval(const Expr& e);
  // The arguments of a call, filter or test node (children[1..] and kwargs).
  CallArgs eval_args(const Expr& node);
  Value call(const Value& callee, CallArgs& args);
  Value call_macro(const MacroDef& macro, const std::shared_ptr<Scope>& closure, CallArgs& args);
  // The sandbox's getattr (a.b) and getitem (a[b]).
  Value get_attr(const Value& obj, const Value& name);
  Value get_item(const Value& obj, const Value& key);

  // A namespace() this render made, cleared when it ends.
  void track(std::shared_ptr<const NamespaceObj> ns) { namespaces_.push_back(std::move(ns)); }

  std::time_t now() const { return now_; }
  int line = 0;          // the line being run, for error messages
  bool folding = false;  // evaluating constants at parse time, as jinja2's optimizer (as_const)

 private:
  Flow exec(const std::vector<Stmt>& stmts);
  Flow exec_stmt(const Stmt& s);
  Flow exec_if(const Stmt& s);
  void exec_for(const Stmt& s);
  void exec_generation(const Stmt& s);
  void exec_with(const Stmt& s);
  // Runs `body` as a new frame under the current one, into a buffer.
  std::string render_frame(const Body& body);
  std::shared_ptr<Scope> new_scope(const std::shared_ptr<Scope>& parent, const Body& body);
  Value apply_filter_chain(const Expr* filter, Value input);

  Value lookup(int symbol);
  Value context_value(int symbol);
  void assign(const Target& target, const Value& v, Scope& scope);

  Value eval_node(const Expr& e);
  Value eval_call(const Expr& e);
  Value eval_item(const Expr& e);
  Value eval_compare(const Expr& e);
  Value eval_unary(const Expr& e, const Value& v);
  Value eval_collection(const Expr& e);

  const TemplateAst& ast_;
  const Json& vars_;
  std::time_t now_;
  std::vector<Value> context_;  // render variables and globals, by symbol, looked up once
  std::vector<uint8_t> context_known_;
  std::shared_ptr<Scope> scope_;
  std::vector<std::shared_ptr<Scope>> scopes_;  // every scope made, for ~Interp
  std::vector<std::shared_ptr<const NamespaceObj>> namespaces_;
  std::vector<std::shared_ptr<const LoopObj>> loops_;
  std::string root_out_;
  std::string* out_ = &root_out_;
  Spans* spans_ = nullptr;
  Spans* char_spans_ = nullptr;
  int depth_ = 0;  // macro calls
  int nest_ = 0;   // eval() calls in progress
  // This render's budget (TemplateLimits), set as the thread's while the Interp lives.
  RenderBudget budget_;
  RenderBudget* outer_budget_ = nullptr;
  // Throws Failure when the text being written has grown past limits.max_output_bytes.
  void check_output() const;
};

// Python's binary operators (+ - * / // % **) on values, and str % args.
Value binary_op(BinOp op, const Value& a, const Value& b);
// markupsafe.escape
std::string html_escape(std::string_view s);

// jinja_filters.cpp, jinja_tests.cpp
Value apply_filter(Interp& interp, const Expr& filter, Value input);
bool apply_test(Interp& interp, const Expr& test, const Value& subject);
bool run_test(Interp& interp, TestId id, const Value& v, const CallArgs& args);

// jinja_methods.cpp: attributes, methods and globals.
// The attribute `name` of a str, dict, list, tuple, loop or number the way Python's getattr finds
// it (a bound method, a loop property); `found` false when Python has no such attribute.
Value builtin_attr(const Value& obj, const std::string& name, bool* found);
Value call_method(Interp& interp, const Value& self, const std::string& name, CallArgs& args);
// The globals transformers' environment has (range, namespace, dict, raise_exception,
// strftime_now, ...); `found` false for other names.
Value global_value(const std::string& name, bool* found);
// Python's printf-style `fmt % args` and str.format(*args, **kwargs), for the conversions chat
// templates use; others throw Failure.
// `mapping`, when not null, is what %(name)s looks names up in; with one, unused arguments are no
// error (Python treats any right operand with __getitem__, other than a tuple or str, this way).
std::string printf_format(const std::string& fmt, const std::vector<Value>& positional, const Value* mapping);
std::string format_method(Interp& interp, const std::string& fmt, const CallArgs& args);

// Argument helpers shared by filters and methods: the i-th positional argument or the keyword
// `name`, or `fallback` when neither is given.
const Value* find_arg(const CallArgs& args, size_t index, const char* name);
Value arg_or(const CallArgs& args, size_t index, const char* name, const Value& fallback);
// Throws Failure when more positional arguments than `max` or an unknown keyword is given.
void check_args(const CallArgs& args, const char* what, size_t max, std::initializer_list<const char*> names);

}  // namespace fsdp::chat::jinja

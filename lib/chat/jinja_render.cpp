// Statements: output, if, for (with loop, filters, else, break/continue), set, macros, frames.
#include "chat/jinja_interp.h"
#include "chat/jinja_unicode.h"

namespace fsdp::chat::jinja {
namespace {

struct MacroValue : Callable {
  std::shared_ptr<const MacroDef> def;
  std::shared_ptr<Scope> closure;
  Value call(Interp& interp, CallArgs& args) const override {
    // jinja2 runs such a macro with the frame's variables reset to a `missing` marker; we refuse.
    if (closure->ended)
      throw Failure("calling macro " + py_repr_string(def->name) +
                    " after the block that defined it ended is not supported");
    return interp.call_macro(*def, closure, args);
  }
  std::string repr() const override { return "<Macro " + py_repr_string(def->name) + ">"; }
  std::string type_name() const override { return "Macro"; }
};

// Python's `a, b = value`.
std::vector<Value> unpack(const Value& v, size_t n) {
  const Items items = py_iter(v);
  if (items.size() > n) throw Failure("too many values to unpack (expected " + std::to_string(n) + ")");
  if (items.size() < n) {
    throw Failure("not enough values to unpack (expected " + std::to_string(n) + ", got " +
                  std::to_string(items.size()) + ")");
  }
  std::vector<Value> out;
  for (size_t i = 0; i < n; ++i) out.push_back(items[i]);
  return out;
}

}  // namespace

Interp::Interp(const TemplateAst& ast, const Json& variables, std::time_t now)
    : ast_(ast),
      vars_(variables),
      now_(now),
      context_(ast.symbols.size()),
      context_known_(ast.symbols.size(), 0),
      scope_(std::make_shared<Scope>()) {
  scopes_.push_back(scope_);
  budget_.limits = &ast.limits;
  outer_budget_ = render_budget();
  render_budget() = &budget_;
}

void Interp::check_output() const {
  if (static_cast<int64_t>(out_->size()) > ast_.limits.max_output_bytes)
    throw Failure(over_limit("the template wrote more bytes than", ast_.limits.max_output_bytes,
                             "data.chat_template_max_output"));
}

Interp::~Interp() {
  render_budget() = outer_budget_;
  for (const auto& s : scopes_) s->vars.clear();
  for (const auto& ns : namespaces_) ns->attrs.items.clear();
  for (const auto& l : loops_) l->changed_value = Value();
}

std::string Interp::render(Spans* spans, Spans* char_spans) {
  spans_ = spans;
  char_spans_ = char_spans;
  for (int s : ast_.root.missing) scope_->set(s, Value::missing());
  exec(ast_.root.stmts);
  return std::move(root_out_);
}

Flow Interp::exec(const std::vector<Stmt>& stmts) {
  for (const Stmt& s : stmts) {
    const Flow f = exec_stmt(s);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Flow Interp::exec_stmt(const Stmt& s) {
  line = s.line;
  switch (s.kind) {
    case StmtKind::kText:
      out_->append(s.text);
      check_output();
      break;
    case StmtKind::kOutput:
      for (const ExprPtr& e : s.exprs) append_py_str(*out_, eval(*e));
      check_output();
      break;
    case StmtKind::kIf:
      return exec_if(s);
    case StmtKind::kFor:
      exec_for(s);
      break;
    case StmtKind::kSet:
      assign(s.targets[0], eval(*s.exprs[0]), *scope_);
      break;
    case StmtKind::kSetBlock: {
      Value v = Value::string(render_frame(s.bodies[0]));
      line = s.line;
      if (!s.exprs.empty()) v = apply_filter_chain(s.exprs[0].get(), std::move(v));
      assign(s.targets[0], v, *scope_);
      break;
    }
    case StmtKind::kMacro: {
      auto m = std::make_shared<MacroValue>();
      m->def = s.macro;
      m->closure = scope_;
      scope_->set(s.macro->symbol, Value::object(Type::kCallable, std::move(m)));
      break;
    }
    case StmtKind::kGeneration:
      exec_generation(s);
      break;
    case StmtKind::kFilterBlock: {
      Value v = Value::string(render_frame(s.bodies[0]));
      line = s.line;
      append_py_str(*out_, apply_filter_chain(s.exprs[0].get(), std::move(v)));
      check_output();
      break;
    }
    case StmtKind::kWith:
      exec_with(s);
      break;
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

Flow Interp::exec_if(const Stmt& s) {
  for (size_t k = 0; k < s.exprs.size(); ++k) {
    line = s.exprs[k]->line;
    if (truthy(eval(*s.exprs[k]))) return exec(s.bodies[k].stmts);
  }
  if (s.has_else) return exec(s.bodies.back().stmts);
  return Flow::kNormal;
}

void Interp::exec_for(const Stmt& s) {
  const Value iterable = eval(*s.exprs[0]);
  Items items = py_iter(iterable);
  const Target& target = s.targets[0];
  if (s.exprs.size() > 1) {  // for x in xs if cond: the loop only sees the items that pass
    auto kept = std::make_shared<std::vector<Value>>();
    const std::shared_ptr<Scope> outer = scope_;
    for (size_t i = 0; i < items.size(); ++i) {
      budget_.charge(1);
      scope_ = std::make_shared<Scope>();
      scope_->parent = outer;
      scopes_.push_back(scope_);
      assign(target, items[i], *scope_);
      const bool keep = truthy(eval(*s.exprs[1]));
      scope_ = outer;
      if (keep) kept->push_back(items[i]);
    }
    items = Items{std::move(kept), 0};
  }
  if (items.size() == 0) {
    if (s.has_else) {
      const std::shared_ptr<Scope> outer = scope_;
      scope_ = new_scope(outer, s.bodies[1]);
      exec(s.bodies[1].stmts);
      scope_->ended = true;
      scope_ = outer;
    }
    return;
  }
  auto loop = std::make_shared<LoopObj>();
  loop->items = items.items;
  loop->begin = items.begin;
  loops_.push_back(loop);
  const Value loop_value = Value::object(Type::kLoop, loop);
  const std::shared_ptr<Scope> outer = scope_;
  for (size_t i = 0; i < items.size(); ++i) {
    budget_.charge(1);
    loop->index0 = i;
    scope_ = new_scope(outer, s.bodies[0]);
    scope_->set(ast_.loop_symbol, loop_value);
    assign(target, items[i], *scope_);
    const Flow f = exec(s.bodies[0].stmts);
    scope_->ended = true;
    scope_ = outer;
    if (f == Flow::kBreak) break;
  }
}

void Interp::exec_generation(const Stmt& s) {
  // transformers' AssistantTracker: the body renders as a caller macro (its own frame, into a
  // buffer); the span starts at the length of the output the template has yielded so far.
  const std::string text = render_frame(s.bodies[0]);
  const size_t start = root_out_.size();
  spans_->emplace_back(start, start + text.size());
  const size_t char_start = utf8_length(root_out_);
  char_spans_->emplace_back(char_start, char_start + utf8_length(text));
  out_->append(text);
  check_output();
}

void Interp::exec_with(const Stmt& s) {
  std::vector<Value> values;
  for (const ExprPtr& e : s.exprs) values.push_back(eval(*e));
  const std::shared_ptr<Scope> outer = scope_;
  scope_ = new_scope(outer, s.bodies[0]);
  for (size_t i = 0; i < values.size(); ++i) assign(s.targets[i], values[i], *scope_);
  exec(s.bodies[0].stmts);
  scope_->ended = true;
  scope_ = outer;
}

std::shared_ptr<Scope> Interp::new_scope(const std::shared_ptr<Scope>& parent, const Body& body) {
  auto scope = std::make_shared<Scope>();
  scope->parent = parent;
  for (int m : body.missing) scope->vars.emplace_back(m, Value::missing());
  scopes_.push_back(scope);
  return scope;
}

std::string Interp::render_frame(const Body& body) {
  std::string buf;
  std::string* const saved_out = out_;
  const std::shared_ptr<Scope> outer = scope_;
  out_ = &buf;
  scope_ = new_scope(outer, body);
  exec(body.stmts);
  scope_->ended = true;
  scope_ = outer;
  out_ = saved_out;
  return buf;
}

Value Interp::apply_filter_chain(const Expr* filter, Value input) {
  // The innermost filter (the first written) takes the block's text.
  if (filter->children[0] != nullptr) input = apply_filter_chain(filter->children[0].get(), std::move(input));
  line = filter->line;
  return apply_filter(*this, *filter, std::move(input));
}

Value Interp::call_macro(const MacroDef& macro, const std::shared_ptr<Scope>& closure, CallArgs& args) {
  if (depth_ >= ast_.limits.max_depth)
    throw Failure(over_limit("macro calls nest deeper than", ast_.limits.max_depth, "data.chat_template_max_depth"));
  const size_t n = macro.params.size();
  if (args.positional.size() > n && !macro.uses_varargs) {
    throw Failure("macro " + py_repr_string(macro.name) + " takes not more than " + std::to_string(n) + " argument(s)");
  }
  std::shared_ptr<Scope> scope = new_scope(closure, macro.body);
  std::vector<bool> given(n, false);
  for (size_t i = 0; i < n && i < args.positional.size(); ++i) {
    scope->set(macro.params[i], args.positional[i]);
    given[i] = true;
  }
  DictObj extra;
  for (auto& [key, value] : args.keyword) {
    size_t i = args.positional.size();
    while (i < n && macro.param_names[i] != key) ++i;
    if (i < n) {
      scope->set(macro.params[i], value);
      given[i] = true;
    } else if (macro.uses_kwargs) {
      extra.set(Value::string(key), value);
    } else {
      throw Failure("macro " + py_repr_string(macro.name) + " takes no keyword argument " + py_repr_string(key));
    }
  }
  if (macro.uses_kwargs) scope->set(ast_.kwargs_symbol, Value::dict(std::move(extra)));
  if (macro.uses_varargs) {
    std::vector<Value> rest;
    for (size_t i = n; i < args.positional.size(); ++i) rest.push_back(args.positional[i]);
    scope->set(ast_.varargs_symbol, Value::seq(std::move(rest), SeqKind::kTuple));
  }
  std::string buf;
  std::string* const saved_out = out_;
  const std::shared_ptr<Scope> saved_scope = scope_;
  const int saved_line = line;
  scope_ = scope;
  ++depth_;
  const size_t first_default = n - macro.defaults.size();
  for (size_t i = 0; i < n; ++i) {
    if (given[i]) continue;
    scope->set(macro.params[i],
               i >= first_default
                   ? eval(*macro.defaults[i - first_default])
                   : Value::undefined_hint("parameter " + py_repr_string(macro.param_names[i]) + " was not provided"));
  }
  out_ = &buf;
  exec(macro.body.stmts);
  scope->ended = true;
  --depth_;
  out_ = saved_out;
  scope_ = saved_scope;
  line = saved_line;
  return Value::string(std::move(buf));
}

Value Interp::lookup(int symbol) {
  for (Scope* s = scope_.get(); s != nullptr; s = s->parent.get()) {
    if (Value* v = s->find(symbol)) {
      if (v->is_missing()) return Value::undefined_name(ast_.symbols[symbol]);
      return *v;
    }
  }
  return context_value(symbol);
}

Value Interp::context_value(int symbol) {
  if (!context_known_[symbol]) {
    const std::string& name = ast_.symbols[symbol];
    const auto it = vars_.find(name);
    bool found = false;
    if (it != vars_.end()) {
      context_[symbol] = from_json(*it);
    } else {
      context_[symbol] = global_value(name, &found);
      if (!found) context_[symbol] = Value::undefined_name(name);
    }
    context_known_[symbol] = 1;
  }
  return context_[symbol];
}

void Interp::assign(const Target& target, const Value& v, Scope& scope) {
  switch (target.kind) {
    case Target::Kind::kName:
      scope.set(target.symbol, v);
      return;
    case Target::Kind::kTuple: {
      const std::vector<Value> parts = unpack(v, target.items.size());
      for (size_t i = 0; i < parts.size(); ++i) assign(target.items[i], parts[i], scope);
      return;
    }
    case Target::Kind::kNsAttr: {
      const Value ns = lookup(target.symbol);
      if (ns.type() != Type::kNamespace) throw Failure("cannot assign attribute on non-namespace object");
      if (!target.attr.empty() && target.attr[0] == '_') {
        throw Failure("Chat templates cannot store underscore-prefixed attributes on a namespace, but got " +
                      py_repr_string(target.attr) + ". Please rename the attribute.");
      }
      ns.ns().attrs.set(Value::string(target.attr), v);
      return;
    }
  }
}

}  // namespace fsdp::chat::jinja

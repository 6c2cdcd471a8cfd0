// Which variables each frame reads as undefined before assigning them: jinja2's symbol analysis
// (jinja2/idtracking.py) replayed on our AST. jinja2 compiles a frame's variables to Python locals
// bound on entry: to an outer local (alias), to the render context (resolve), or to `missing` when
// the frame's first use of the name is an unconditional assignment and no outer frame knows it.
// The interpreter looks names up dynamically, which gives the same results except in that last
// case, so that is what we record (Body::missing).
#include <map>
#include <set>

#include "chat/jinja_ast.h"

namespace fsdp::chat::jinja {
namespace {

enum class Load { kParam, kResolve, kAlias, kUndefined };

struct Symbols {
  const Symbols* parent = nullptr;
  std::map<int, Load> loads;  // jinja2's refs and their initial loads
  std::set<int> stores;

  bool has_ref(int s) const {
    for (const Symbols* p = this; p != nullptr; p = p->parent) {
      if (p->loads.count(s)) return true;
    }
    return false;
  }
  void load(int s) {
    if (!has_ref(s)) loads[s] = Load::kResolve;
  }
  void store(int s) {
    stores.insert(s);
    if (!loads.count(s)) loads[s] = parent != nullptr && parent->has_ref(s) ? Load::kAlias : Load::kUndefined;
  }
  void param(int s) {
    stores.insert(s);
    loads[s] = Load::kParam;
  }
  void branch_update(const std::vector<Symbols>& branches) {
    std::set<int> fresh;
    for (const Symbols& b : branches) {
      for (int s : b.stores) {
        if (!stores.count(s)) fresh.insert(s);
      }
    }
    for (const Symbols& b : branches) {
      for (const auto& [s, l] : b.loads) loads[s] = l;
      stores.insert(b.stores.begin(), b.stores.end());
    }
    for (int s : fresh) loads[s] = parent != nullptr && parent->has_ref(s) ? Load::kAlias : Load::kResolve;
  }
};

// jinja2's FrameSymbolVisitor: what one frame's own statements read and assign.
class FrameVisitor {
 public:
  explicit FrameVisitor(Symbols* sym) : sym_(sym) {}

  void expr(const Expr* e) {
    if (e == nullptr) return;
    if (e->kind == ExprKind::kName) sym_->load(e->symbol);
    for (const ExprPtr& c : e->children) expr(c.get());
    for (const auto& kw : e->kwargs) expr(kw.second.get());
  }

  void stmts(const std::vector<Stmt>& list) {
    for (const Stmt& s : list) stmt(s);
  }

  void store(const Target& t) {
    if (t.kind == Target::Kind::kName) sym_->store(t.symbol);
    if (t.kind == Target::Kind::kNsAttr) sym_->load(t.symbol);
    for (const Target& item : t.items) store(item);
  }

 private:
  void stmt(const Stmt& s) {
    switch (s.kind) {
      case StmtKind::kOutput:
      case StmtKind::kWith:
        for (const ExprPtr& e : s.exprs) expr(e.get());
        return;
      case StmtKind::kIf:
        visit_if(s);
        return;
      case StmtKind::kFor:
        expr(s.exprs[0].get());
        return;
      case StmtKind::kSet:
        expr(s.exprs[0].get());
        store(s.targets[0]);
        return;
      case StmtKind::kSetBlock:
        store(s.targets[0]);
        return;
      case StmtKind::kMacro:
        sym_->store(s.macro->symbol);
        return;
      case StmtKind::kFilterBlock:
        expr(s.exprs[0].get());
        return;
      default:
        return;
    }
  }

  // jinja2 visits the if-branch, the chain of elifs and the else-branch each on a copy of the
  // symbols, then merges them (branch_update).
  void visit_if(const Stmt& s) {
    expr(s.exprs[0].get());
    Symbols* outer = sym_;
    std::vector<Symbols> branches(3, *outer);
    sym_ = &branches[0];
    stmts(s.bodies[0].stmts);
    sym_ = &branches[1];
    for (size_t k = 1; k < s.exprs.size(); ++k) {
      expr(s.exprs[k].get());
      std::vector<Symbols> elif (1, branches[1]);
      sym_ = &elif[0];
      stmts(s.bodies[k].stmts);
      branches[1].branch_update(elif);
      sym_ = &branches[1];
    }
    sym_ = &branches[2];
    if (s.has_else) stmts(s.bodies.back().stmts);
    sym_ = outer;
    outer->branch_update(branches);
  }

  Symbols* sym_;
};

bool expr_loads(const Expr* e, int symbol) {
  if (e == nullptr) return false;
  if (e->kind == ExprKind::kName && e->symbol == symbol) return true;
  for (const ExprPtr& c : e->children) {
    if (expr_loads(c.get(), symbol)) return true;
  }
  for (const auto& kw : e->kwargs) {
    if (expr_loads(kw.second.get(), symbol)) return true;
  }
  return false;
}

// Whether a body reads `symbol` anywhere, nested frames included (jinja2's find_undeclared).
bool body_loads(const Body& body, int symbol) {
  if (symbol < 0) return false;
  for (const Stmt& s : body.stmts) {
    for (const ExprPtr& e : s.exprs) {
      if (expr_loads(e.get(), symbol)) return true;
    }
    for (const Body& b : s.bodies) {
      if (body_loads(b, symbol)) return true;
    }
    if (s.macro) {
      for (const ExprPtr& d : s.macro->defaults) {
        if (expr_loads(d.get(), symbol)) return true;
      }
      if (body_loads(s.macro->body, symbol)) return true;
    }
  }
  return false;
}

void collect_names(const Target& t, std::vector<int>& out) {
  if (t.kind == Target::Kind::kName) out.push_back(t.symbol);
  for (const Target& item : t.items) collect_names(item, out);
}

class Analyzer {
 public:
  explicit Analyzer(TemplateAst& ast) : ast_(ast) {}

  void frame(Body& body, const Symbols* parent, const std::vector<int>& params, const Expr* extra = nullptr,
             const std::vector<ExprPtr>* defaults = nullptr) {
    Symbols sym;
    sym.parent = parent;
    for (int p : params) sym.param(p);
    FrameVisitor visitor(&sym);
    if (defaults != nullptr) {
      for (const ExprPtr& d : *defaults) visitor.expr(d.get());
    }
    visitor.expr(extra);
    visitor.stmts(body.stmts);
    body.missing.clear();
    for (const auto& [s, l] : sym.loads) {
      if (l == Load::kUndefined) body.missing.push_back(s);
    }
    children(body.stmts, sym);
  }

 private:
  void children(std::vector<Stmt>& stmts, const Symbols& sym) {
    for (Stmt& s : stmts) {
      std::vector<int> params;
      switch (s.kind) {
        case StmtKind::kIf:
          for (Body& b : s.bodies) children(b.stmts, sym);
          break;
        case StmtKind::kFor:
          collect_names(s.targets[0], params);
          params.push_back(loop_symbol());
          frame(s.bodies[0], &sym, params);
          if (s.has_else) frame(s.bodies[1], &sym, {});
          break;
        case StmtKind::kMacro: {
          MacroDef& m = *s.macro;
          m.uses_varargs = body_loads(m.body, ast_.varargs_symbol);
          m.uses_kwargs = body_loads(m.body, ast_.kwargs_symbol);
          params = m.params;
          if (m.uses_varargs) params.push_back(ast_.varargs_symbol);
          if (m.uses_kwargs) params.push_back(ast_.kwargs_symbol);
          frame(m.body, &sym, params, nullptr, &m.defaults);
          break;
        }
        case StmtKind::kGeneration:
        case StmtKind::kSetBlock:
          frame(s.bodies[0], &sym, {});
          break;
        case StmtKind::kFilterBlock:
          frame(s.bodies[0], &sym, {}, s.exprs[0].get());
          break;
        case StmtKind::kWith:
          for (const Target& t : s.targets) collect_names(t, params);
          frame(s.bodies[0], &sym, params);
          break;
        default:
          break;
      }
    }
  }

  int loop_symbol() {
    if (ast_.loop_symbol < 0) {
      ast_.loop_symbol = static_cast<int>(ast_.symbols.size());
      ast_.symbols.push_back("loop");
    }
    return ast_.loop_symbol;
  }

  TemplateAst& ast_;
};

int find_symbol(const TemplateAst& ast, const char* name) {
  for (size_t i = 0; i < ast.symbols.size(); ++i) {
    if (ast.symbols[i] == name) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

void analyze_frames(TemplateAst& ast) {
  ast.loop_symbol = find_symbol(ast, "loop");
  ast.varargs_symbol = find_symbol(ast, "varargs");
  ast.kwargs_symbol = find_symbol(ast, "kwargs");
  Analyzer(ast).frame(ast.root, nullptr, {});
}

}  // namespace fsdp::chat::jinja

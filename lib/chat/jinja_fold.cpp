// jinja2's constant folding (jinja2/optimizer.py and the nodes' as_const), which is observable:
// a subexpression made of constants is computed once at compile time, slices included, and there
// slicing goes through the sandbox's getitem (a TypeError gives Undefined) where at run time it
// is a plain Python subscript (a TypeError is raised). A folded subexpression replaces its node
// when its value has a "safe repr" (None, bool, numbers, str, range, and tuples, lists and dicts
// of those); a whole {{ expression }} is folded whatever its value.
#include "chat/jinja_ast.h"
#include "chat/jinja_interp.h"

namespace fsdp::chat::jinja {
namespace {

bool safe_repr(const Value& v) {
  switch (v.type()) {
    case Type::kNone:
    case Type::kBool:
    case Type::kInt:
    case Type::kFloat:
    case Type::kString:
      return true;
    case Type::kSeq:
      if (v.is_seq(SeqKind::kRange)) return true;
      if (!v.is_list_or_tuple()) return false;
      for (const Value& item : v.seq().items) {
        if (!safe_repr(item)) return false;
      }
      return true;
    case Type::kDict:
      for (const auto& [k, item] : v.dict().items) {
        if (!safe_repr(k) || !safe_repr(item)) return false;
      }
      return true;
    default:
      return false;
  }
}

class Folder {
 public:
  explicit Folder(TemplateAst& ast) : interp_(ast, empty_, 0) { interp_.folding = true; }

  void body(Body& b) {
    for (Stmt& s : b.stmts) {
      for (ExprPtr& e : s.exprs) {
        fold(e);
        if (s.kind == StmtKind::kOutput) fold_output(e);
      }
      for (Body& inner : s.bodies) body(inner);
      if (s.macro) {
        for (ExprPtr& d : s.macro->defaults) fold(d);
        body(s.macro->body);
      }
    }
  }

 private:
  // Node.as_const: false where jinja2 raises Impossible.
  bool try_const(const Expr* e, Value* out) {
    if (e == nullptr) return false;
    switch (e->kind) {
      case ExprKind::kConst:
        *out = e->value;
        return true;
      case ExprKind::kName:
      case ExprKind::kCall:
      case ExprKind::kSlice:
        return false;
      case ExprKind::kAnd:
      case ExprKind::kOr: {
        Value left;
        if (!try_const(e->children[0].get(), &left)) return false;
        if (truthy(left) == (e->kind == ExprKind::kOr)) {
          *out = left;
          return true;
        }
        return try_const(e->children[1].get(), out);
      }
      case ExprKind::kCond: {
        Value test;
        if (!try_const(e->children[0].get(), &test)) return false;
        return try_const(e->children[truthy(test) ? 1 : 2].get(), out);
      }
      case ExprKind::kFilter:
        // Filters that take the context are never folded; unknown ones cannot be.
        if (e->lookup != Lookup::kSupported || e->children[0] == nullptr || e->name == "map" || e->name == "select" ||
            e->name == "reject" || e->name == "selectattr" || e->name == "rejectattr") {
          return false;
        }
        break;
      case ExprKind::kTest:
        if (e->lookup != Lookup::kSupported) return false;
        break;
      default:
        break;
    }
    Value ignored;
    for (const ExprPtr& c : e->children) {
      if (c == nullptr) continue;
      if (c->kind == ExprKind::kSlice) {
        for (const ExprPtr& part : c->children) {
          if (part != nullptr && !try_const(part.get(), &ignored)) return false;
        }
      } else if (!try_const(c.get(), &ignored)) {
        return false;
      }
    }
    for (const auto& kw : e->kwargs) {
      if (!try_const(kw.second.get(), &ignored)) return false;
    }
    try {
      *out = interp_.eval(*e);
      return true;
    } catch (const Raised&) {
      return false;
    } catch (const std::exception&) {  // as_const turns any exception into Impossible
      return false;
    }
  }

  // The optimizer: children first, then the node itself.
  void fold(ExprPtr& e) {
    if (e == nullptr) return;
    for (ExprPtr& c : e->children) fold(c);
    for (auto& kw : e->kwargs) fold(kw.second);
    if (e->kind == ExprKind::kConst || e->kind == ExprKind::kSlice) return;
    Value v;
    if (try_const(e.get(), &v) && safe_repr(v)) replace(e, std::move(v));
  }

  // An output's child is folded whatever its value (jinja2's _output_child_to_const).
  void fold_output(ExprPtr& e) {
    Value v;
    if (e->kind != ExprKind::kConst && try_const(e.get(), &v)) replace(e, std::move(v));
  }

  static void replace(ExprPtr& e, Value v) {
    auto c = std::make_unique<Expr>();
    c->kind = ExprKind::kConst;
    c->line = e->line;
    c->value = std::move(v);
    e = std::move(c);
  }

  const Json empty_ = Json::object();
  Interp interp_;
};

}  // namespace

void fold_constants(TemplateAst& ast) {
  Folder(ast).body(ast.root);
}

}  // namespace fsdp::chat::jinja

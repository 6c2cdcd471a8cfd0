#include "chat/jinja.h"

#include "chat/jinja_ast.h"
#include "chat/jinja_interp.h"
#include "chat/jinja_unicode.h"

namespace fsdp::chat {

Template::Template(const std::string& source, const std::string& where, const TemplateLimits& limits) {
  const size_t bad = jinja::utf8_first_invalid(source);
  if (bad != std::string::npos) {
    int line = 1;
    for (size_t i = 0; i < bad; ++i) line += source[i] == '\n';
    throw InputError(str(where, ":", line, ": the template is not valid UTF-8 (byte ", bad, ")"));
  }
  ast_ = jinja::parse_template(source, where, limits);
}

const std::string& Template::where() const {
  return ast_->where;
}

Template::Output Template::render(const Json& variables) const {
  return render(variables, std::time(nullptr));
}

Template::Output Template::render(const Json& variables, std::time_t now) const {
  if (!variables.is_object()) throw InputError(str(ast_->where, ": the variables must be a JSON object"));
  Output out;
  jinja::Interp interp(*ast_, variables, now);
  try {
    out.text = interp.render(&out.generation_spans, &out.generation_char_spans);
  } catch (const jinja::Raised& r) {
    throw TemplateRaise(r.message, ast_->where, r.line);
  } catch (const jinja::Failure& f) {
    throw InputError(str(ast_->where, ":", interp.line, ": ", f.what()));
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {  // a template that builds more than the machine holds
    throw InputError(str(ast_->where, ":", interp.line, ": the template ran out of memory; its limits ",
                         "(data.chat_template_max_output, _max_string, _max_iterations) bound what it may build"));
  } catch (const std::exception& e) {  // a bug of ours, not the template's
    throw Error(str(ast_->where, ":", interp.line, ": internal error of the Jinja engine: ", e.what()));
  }
  return out;
}

}  // namespace fsdp::chat

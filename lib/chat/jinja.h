// Hugging Face chat templates: a Jinja2 engine that renders byte for byte what transformers'
// apply_chat_template renders (jinja2's ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks, the loopcontrols extension, transformers' {% generation %} tag, the globals
// raise_exception and strftime_now, and transformers' tojson filter).
//
// What it supports: {{ }}, {% %}, {# #}, whitespace control (-, +), raw blocks; if/elif/else,
// for (unpacking, `if` filter, else, loop.*, break/continue), set (also the block form and
// namespace attributes), macros (default and keyword arguments, varargs/kwargs), with, filter
// blocks, print; Python's operators, literals, slicing, str/dict/list methods, printf-style % and
// str.format without format specs; all of jinja2's tests and its filters except groupby, slice,
// truncate, striptags, wordwrap, urlize, urlencode, xmlattr, filesizeformat, pprint and random;
// jinja2's scoping rules and constant folding. Anything else (include, extends, import, call
// blocks, recursive loops, the lipsum/cycler/joiner globals, unsupported filters or methods,
// integers beyond 64 bits, ...) is refused with an error naming the line, never approximated:
// when the template is parsed, or, inside {% if %} and conditional expressions (where jinja2
// itself only fails if they run), when it runs. Case mapping follows Python 3.11's Unicode
// tables except lowercasing GREEK CAPITAL SIGMA (refused); str.isdigit/isalpha/isalnum and
// |wordcount refuse non-ASCII text.
//
// A Template owns its parsed form and is immutable: render() is const and may run on several
// threads at once. Copies share the parsed form.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "chat/template_limits.h"
#include "util/error.h"

namespace fsdp::chat {

// Insertion order matters: tojson writes a dict's keys in the order Python's dict has them.
using Json = nlohmann::ordered_json;

namespace jinja {
struct TemplateAst;
}

// What the template's raise_exception("...") raised (a conversation the template rejects, such as
// roles that do not alternate). what() is the template's message, unchanged.
class TemplateRaise : public InputError {
 public:
  TemplateRaise(const std::string& message, const std::string& where, int line)
      : InputError(message), where_(where), line_(line) {}
  const std::string& where() const { return where_; }
  int line() const { return line_; }

 private:
  std::string where_;
  int line_;
};

class Template {
 public:
  // Parses `source` once. `where` names it in messages (a file, "tokenizer_config.json:chat_template").
  // Throws InputError "WHERE:LINE: what is wrong" for a syntax error or a construct the engine does
  // not support, and for source that is not valid UTF-8.
  // Throws InputError naming `limits.max_depth` for a template nested deeper.
  Template(const std::string& source, const std::string& where, const TemplateLimits& limits = {});

  struct Output {
    std::string text;
    // Byte offsets [begin, end) into `text` of what each {% generation %} block produced, in the
    // order they ran: the spans transformers' return_assistant_tokens_mask records, in bytes.
    // Like transformers, a block inside a macro, set block or filter block (whose output is not
    // yet in `text` when it runs) is placed at the length of the output so far, which is not
    // where its text ends up; chat templates put the blocks in loops and ifs, where it is.
    std::vector<std::pair<size_t, size_t>> generation_spans;
    // The same spans counted in code points, as transformers returns them.
    std::vector<std::pair<size_t, size_t>> generation_char_spans;
  };

  // Renders with `variables` (a JSON object: messages, tools, add_generation_prompt, bos_token,
  // ...). Throws TemplateRaise for raise_exception(), InputError "WHERE:LINE: ..." for what jinja2
  // would fail on while rendering (an undefined value used, a type error, a sandbox violation), a
  // construct the engine refuses at run time, a limit exceeded (TemplateLimits) or memory running
  // out. strftime_now() reads the clock.
  Output render(const Json& variables) const;
  // The same, with strftime_now() formatting `now` (seconds since the epoch, in the local time
  // zone) instead of the current time: for reproducible renders and tests.
  Output render(const Json& variables, std::time_t now) const;

  const std::string& where() const;

 private:
  std::shared_ptr<const jinja::TemplateAst> ast_;
};

}  // namespace fsdp::chat

#include "util/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "util/error.h"
#include "util/strings.h"

namespace fsdp {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  pcre2_match_context* limits = nullptr;
  bool jit = false;
  std::string pattern, where;

  // A match from `start` (with `options`), or PCRE2's negative code.
  int match(std::string_view text, size_t start, uint32_t options, pcre2_match_data* md) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    // The JIT does not anchor at the end: an end-anchored match takes the interpreter.
    if (jit && (options & PCRE2_ENDANCHORED) == 0)
      return pcre2_jit_match(code, subject, text.size(), start, options, md, limits);
    return pcre2_match(code, subject, text.size(), start, options | PCRE2_NO_UTF_CHECK, md, limits);
  }

  [[noreturn]] void gave_up(int rc, size_t at) const {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    throw InputError(str(where, ": the regex ", excerpt(pattern), " gave up at byte ", at, " of a text (",
                         reinterpret_cast<const char*>(message),
                         "): it backtracks without end on this input. Fix the regex, or remove that text"));
  }
};

Regex::Regex(const std::string& pattern, const std::string& where) : impl_(std::make_unique<Impl>()) {
  impl_->pattern = pattern;
  impl_->where = where;
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw InputError(str(where, ": the regex ", excerpt(pattern), " does not compile at offset ", offset, ": ",
                         reinterpret_cast<const char*>(message)));
  }
  impl_->limits = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(impl_->limits, kMatchLimit);
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (!impl_) return;
  if (impl_->limits) pcre2_match_context_free(impl_->limits);
  if (impl_->code) pcre2_code_free(impl_->code);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = impl_->match(text, start, 0, md);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      impl_->gave_up(rc, start);
    }
    const PCRE2_SIZE* v = pcre2_get_ovector_pointer(md);
    if (v[1] > v[0]) {
      out.emplace_back(v[0], v[1]);
      start = v[1];
    } else {  // an empty match: step over one code point
      start = v[0] + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
  pcre2_match_data_free(md);
  return out;
}

bool Regex::full_match(std::string_view text) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  const int rc = impl_->match(text, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, md);
  pcre2_match_data_free(md);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) impl_->gave_up(rc, 0);
  return true;
}

}  // namespace fsdp

#include "tokenize/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "util/error.h"

namespace fsdp::tokenize {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string pattern, where;
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
    throw InputError(str(where, ": the regex ", pattern, " does not compile at offset ", offset, ": ",
                         reinterpret_cast<const char*>(message)));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, 0, md, nullptr)
                              : pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      pcre2_match_data_free(md);
      throw InputError(str(impl_->where, ": the Split regex ", impl_->pattern, " gave up at byte ", start,
                           " of a text (", reinterpret_cast<const char*>(message),
                           "): it backtracks without end on this input, and tokenizers fails on it too. Fix the "
                           "regex, or remove that text"));
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

}  // namespace fsdp::tokenize

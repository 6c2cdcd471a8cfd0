// jinja2's lexer (jinja2/lexer.py) with transformers' settings: trim_blocks and lstrip_blocks on,
// keep_trailing_newline off, default delimiters, no line statements. Whitespace rules follow the
// regular expressions there exactly: "-" strips Unicode whitespace, "+" keeps it, lstrip_blocks
// removes a line's leading whitespace before {% %} and {# #} only.
#include <cstdlib>
#include <cstring>

#include "chat/jinja_ast.h"
#include "chat/jinja_unicode.h"
#include "util/error.h"

namespace fsdp::chat::jinja {
namespace {

const char* const kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                  "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};

// Source as jinja2 sees it: \r\n and \r become \n, one trailing newline goes.
std::string normalize_source(std::string_view raw) {
  std::string s;
  s.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\r') {
      s += '\n';
      if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
    } else {
      s += raw[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

// `(\d+_)*\d+` at p: the end, or npos.
size_t match_digits(std::string_view s, size_t p, bool (*digit)(char) = is_digit) {
  if (p >= s.size() || !digit(s[p])) return std::string_view::npos;
  while (true) {
    while (p < s.size() && digit(s[p])) ++p;
    if (p + 1 < s.size() && s[p] == '_' && digit(s[p + 1])) {
      ++p;
      continue;
    }
    return p;
  }
}

std::string without_underscores(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != '_') out += c;
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view raw, const std::string& where) : src_(normalize_source(raw)), where_(where) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      if (!lex_root()) break;
    }
    tokens_.push_back(Token{Tok::kEof, line_, "", 0, 0});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw InputError(str(where_, ":", line_, ": ", what)); }

  void emit(Tok type, std::string text) { tokens_.push_back(Token{type, line_, std::move(text), 0, 0}); }

  void count_lines(size_t from, size_t to) {
    for (size_t i = from; i < to; ++i) line_ += src_[i] == '\n';
  }

  // The text before a tag, with the tag's whitespace control applied (jinja2's OptionalLStrip).
  void emit_data(size_t from, size_t to, char sign, bool is_variable) {
    std::string_view text(src_.data() + from, to - from);
    if (sign == '-') {
      size_t end = text.size();
      while (end > 0) {
        size_t start = end - 1;
        while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t p = start;
        if (!py_isspace(utf8_next(text, &p))) break;
        end = start;
      }
      text = text.substr(0, end);
    } else if (sign != '+' && !is_variable) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size() && all_space(text.substr(l_pos))) {
        text = text.substr(0, l_pos);
      }
    }
    if (!text.empty()) emit(Tok::kData, std::string(text));
    count_lines(from, to);
  }

  static bool all_space(std::string_view s) {
    for (size_t p = 0; p < s.size();) {
      if (!py_isspace(utf8_next(s, &p))) return false;
    }
    return true;
  }

  size_t skip_space(size_t p) const {
    while (p < src_.size()) {
      size_t q = p;
      if (!py_isspace(utf8_next(src_, &q))) break;
      p = q;
    }
    return p;
  }

  // `{%[-+]?\s*raw\s*(-%}\s*|%})` at p: the end of the match, or npos.
  size_t match_raw_begin(size_t p) const {
    p += 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_space(p);
    if (src_.compare(p, 3, "raw") != 0) return std::string_view::npos;
    p = skip_space(p + 3);
    if (src_.compare(p, 3, "-%}") == 0) return skip_space(p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string_view::npos;
  }

  // Finds the next tag, emits the data before it and lexes the tag. False at the end.
  bool lex_root() {
    size_t tag = pos_;
    while ((tag = src_.find('{', tag)) != std::string::npos) {
      if (tag + 1 < src_.size() && std::strchr("{%#", src_[tag + 1]) != nullptr) break;
      ++tag;
    }
    if (tag == std::string::npos) {
      emit(Tok::kData, src_.substr(pos_));
      count_lines(pos_, src_.size());
      pos_ = src_.size();
      return false;
    }
    const char kind = src_[tag + 1];
    const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
    const size_t raw_end = kind == '%' ? match_raw_begin(tag) : std::string_view::npos;
    emit_data(pos_, tag, sign, kind == '{');
    pos_ = tag + 2 + (sign ? 1 : 0);
    line_starting_ = false;
    if (raw_end != std::string_view::npos) {
      count_lines(pos_, raw_end);
      line_starting_ = src_[raw_end - 1] == '\n';
      pos_ = raw_end;
      lex_raw();
    } else if (kind == '#') {
      lex_comment();
    } else {
      lex_tag(kind == '{');
    }
    return true;
  }

  void lex_raw() {
    for (size_t p = src_.find("{%", pos_); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      const char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      q = skip_space(q + (sign ? 1 : 0));
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q = skip_space(q + 6);
      const size_t end = match_block_end(q);
      if (end == std::string_view::npos) continue;
      emit_data(pos_, p, sign, false);
      count_lines(p, end);
      line_starting_ = src_[end - 1] == '\n';
      pos_ = end;
      return;
    }
    fail("Missing end of raw directive");
  }

  // `\+%}|\-%}\s*|%}\n?` at p: the end, or npos.
  size_t match_block_end(size_t p) const {
    if (src_.compare(p, 3, "+%}") == 0) return p + 3;
    if (src_.compare(p, 3, "-%}") == 0) return skip_space(p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2 + (p + 2 < src_.size() && src_[p + 2] == '\n');
    return std::string_view::npos;
  }

  void lex_comment() {
    for (size_t p = pos_; p + 1 < src_.size(); ++p) {
      size_t end = std::string_view::npos;
      if (src_.compare(p, 3, "+#}") == 0) {
        end = p + 3;
      } else if (src_.compare(p, 3, "-#}") == 0) {
        end = skip_space(p + 3);
      } else if (src_.compare(p, 2, "#}") == 0) {
        end = p + 2 + (p + 2 < src_.size() && src_[p + 2] == '\n');
      }
      if (end == std::string_view::npos) continue;
      count_lines(pos_, end);
      line_starting_ = src_[end - 1] == '\n';
      pos_ = end;
      return;
    }
    fail("Missing end of comment tag");
  }

  // The end of the tag at pos_ if it is one (only outside brackets, as jinja2's balancing stack).
  size_t match_tag_end(bool variable) const {
    if (!balance_.empty()) return std::string_view::npos;
    if (!variable) return match_block_end(pos_);
    if (src_.compare(pos_, 3, "-}}") == 0) return skip_space(pos_ + 3);
    if (src_.compare(pos_, 2, "}}") == 0) return pos_ + 2;
    return std::string_view::npos;
  }

  void lex_tag(bool variable) {
    emit(variable ? Tok::kVarBegin : Tok::kBlockBegin, "");
    balance_.clear();
    while (true) {
      if (pos_ >= src_.size())
        fail(variable ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      const size_t end = match_tag_end(variable);
      if (end != std::string_view::npos) {
        emit(variable ? Tok::kVarEnd : Tok::kBlockEnd, "");
        count_lines(pos_, end);
        line_starting_ = src_[end - 1] == '\n';
        pos_ = end;
        return;
      }
      const size_t after_space = skip_space(pos_);
      if (after_space != pos_) {
        count_lines(pos_, after_space);
        pos_ = after_space;
        continue;
      }
      if (lex_number() || lex_name() || lex_string() || lex_operator()) continue;
      fail(str("unexpected char ", py_repr_string(std::string(1, src_[pos_])), " at ", pos_));
    }
  }

  bool lex_number() {
    const char c = src_[pos_];
    if (!is_digit(c)) return false;
    const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
    const size_t int_end = match_digits(src_, pos_);
    size_t end = std::string_view::npos;
    if (!after_dot) {
      const size_t frac_end =
          int_end < src_.size() && src_[int_end] == '.' ? match_digits(src_, int_end + 1) : std::string_view::npos;
      const size_t exp_from = frac_end != std::string_view::npos ? frac_end : int_end;
      size_t exp_end = std::string_view::npos;
      if (exp_from < src_.size() && (src_[exp_from] == 'e' || src_[exp_from] == 'E')) {
        size_t q = exp_from + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        exp_end = match_digits(src_, q);
      }
      end = exp_end != std::string_view::npos ? exp_end : frac_end;
    }
    if (end != std::string_view::npos) {
      Token t{Tok::kFloat, line_, src_.substr(pos_, end - pos_), 0, 0};
      t.float_value = std::strtod(without_underscores(t.text).c_str(), nullptr);
      tokens_.push_back(std::move(t));
      pos_ = end;
      return true;
    }
    lex_integer();
    return true;
  }

  void lex_integer() {
    const char prefix = pos_ + 1 < src_.size() ? static_cast<char>(src_[pos_ + 1] | 0x20) : 0;
    int base = 10;
    size_t p = pos_;
    if (src_[pos_] == '0' && (prefix == 'b' || prefix == 'o' || prefix == 'x')) {
      base = prefix == 'b' ? 2 : prefix == 'o' ? 8 : 16;
      p += 2;
      const size_t start = p;
      while (p < src_.size()) {
        const size_t q = p + (src_[p] == '_');
        const char d = q < src_.size() ? static_cast<char>(src_[q] | 0x20) : 0;
        const int v = is_digit(d) ? d - '0' : (d >= 'a' && d <= 'f') ? d - 'a' + 10 : 99;
        if (v >= base) break;
        p = q + 1;
      }
      if (p == start) {
        p = pos_ + 1;  // just "0"
        base = 10;
      }
    } else if (src_[pos_] == '0') {
      p = pos_ + 1;
      while (p < src_.size() && (src_[p] == '0' || (src_[p] == '_' && p + 1 < src_.size() && src_[p + 1] == '0'))) ++p;
    } else {
      p = match_digits(src_, pos_);
    }
    const std::string text = src_.substr(pos_, p - pos_);
    std::string digits = without_underscores(base == 10 ? text : text.substr(2));
    errno = 0;
    const long long v = std::strtoll(digits.c_str(), nullptr, base);
    if (errno == ERANGE) fail(str("integer ", text, " does not fit 64 bits (not supported)"));
    Token t{Tok::kInt, line_, text, v, 0};
    tokens_.push_back(std::move(t));
    pos_ = p;
  }

  bool lex_name() {
    if (static_cast<unsigned char>(src_[pos_]) >= 0x80) fail("non-ASCII names are not supported");
    if (!is_name_start(src_[pos_])) return false;
    size_t p = pos_;
    while (p < src_.size() && is_name_char(src_[p])) ++p;
    if (p < src_.size() && static_cast<unsigned char>(src_[p]) >= 0x80) fail("non-ASCII names are not supported");
    emit(Tok::kName, src_.substr(pos_, p - pos_));
    pos_ = p;
    return true;
  }

  bool lex_string() {
    const char quote = src_[pos_];
    if (quote != '\'' && quote != '"') return false;
    size_t p = pos_ + 1;
    while (p < src_.size() && src_[p] != quote) p += src_[p] == '\\' ? 2 : 1;
    if (p >= src_.size()) return false;  // no closing quote: jinja2 falls through to "unexpected char"
    Token t{Tok::kString, line_, unescape(std::string_view(src_).substr(pos_ + 1, p - pos_ - 1)), 0, 0};
    tokens_.push_back(std::move(t));
    count_lines(pos_, p + 1);
    pos_ = p + 1;
    return true;
  }

  // Python's "unicode-escape" codec after "backslashreplace" (what jinja2 does to string literals).
  std::string unescape(std::string_view s) const;

  bool lex_operator() {
    for (const char* op : kOperators) {
      const size_t n = std::strlen(op);
      if (src_.compare(pos_, n, op) != 0) continue;
      const char c = op[0];
      if (n == 1 && (c == '(' || c == '[' || c == '{')) balance_.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      if (n == 1 && (c == ')' || c == ']' || c == '}')) {
        if (balance_.empty()) fail(str("unexpected '", c, "'"));
        if (balance_.back() != c) fail(str("unexpected '", c, "', expected '", balance_.back(), "'"));
        balance_.pop_back();
      }
      emit(Tok::kOp, op);
      pos_ += n;
      return true;
    }
    return false;
  }

  std::string src_;
  const std::string& where_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<char> balance_;
  std::vector<Token> tokens_;
};

int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  c = static_cast<char>(c | 0x20);
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

std::string Lexer::unescape(std::string_view s) const {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out += s[i++];
      continue;
    }
    const char c = s[i + 1];
    const char* simple = std::strchr("\\'\"abfnrtv", c);
    if (c != 0 && simple != nullptr) {
      static const char kDecoded[] = "\\'\"\a\b\f\n\r\t\v";
      out += kDecoded[simple - "\\'\"abfnrtv"];
      i += 2;
    } else if (c == '\n') {
      i += 2;  // line continuation
    } else if (c >= '0' && c <= '7') {
      int v = 0, n = 0;
      for (i += 1; n < 3 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++i, ++n) v = v * 8 + (s[i] - '0');
      utf8_append(out, static_cast<char32_t>(v));
    } else if (c == 'x' || c == 'u' || c == 'U') {
      const int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
      uint32_t v = 0;
      for (int k = 0; k < digits; ++k) {
        const int h = i + 2 + k < s.size() ? hex_value(s[i + 2 + k]) : -1;
        if (h < 0) fail(str("truncated \\", c, "XX escape in a string literal"));
        v = v * 16 + static_cast<uint32_t>(h);
      }
      if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        fail("string literal escape outside valid Unicode scalar values");
      utf8_append(out, v);
      i += 2 + digits;
    } else if (c == 'N') {
      fail("\\N{...} escapes in string literals are not supported");
    } else if (static_cast<unsigned char>(c) >= 0x80) {
      // backslashreplace turned the character into \xNN, \uNNNN or \UNNNNNNNN after a literal backslash.
      size_t p = i + 1;
      const char32_t cp = utf8_next(s, &p);
      char buf[16];
      std::snprintf(buf, sizeof buf,
                    cp <= 0xFF     ? "\\x%02x"
                    : cp <= 0xFFFF ? "\\u%04x"
                                   : "\\U%08x",
                    static_cast<unsigned>(cp));
      out += buf;
      i = p;
    } else {
      out += '\\';  // unknown escapes stay as they are
      i += 1;
    }
  }
  return out;
}

}  // namespace

std::vector<Token> lex_template(std::string_view source, const std::string& where) {
  return Lexer(source, where).run();
}

}  // namespace fsdp::chat::jinja

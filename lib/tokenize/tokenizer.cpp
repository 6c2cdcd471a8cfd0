#include "tokenize/tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "tokenize/unicode.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/regex.h"
#include "util/strings.h"

namespace fsdp::tokenize {

namespace {

using json = nlohmann::json;

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A stretch of text on its way through the pipeline, with its byte offset in the input (Metaspace's
// prepend_scheme "first" prepends only at offset 0).
struct Piece {
  std::string text;
  size_t offset = 0;
  int32_t added = -1;  // the id of the added token this piece is; -1: ordinary text
};

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

std::string type_of(const json& j) {
  return j.is_object() ? j.value("type", std::string("(no type)")) : std::string("(not an object)");
}

// Real vocabularies hold under a million tokens; an id past this is a damaged or hostile file, and
// would cost memory by the id (the id -> token table).
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

// A token id as the file writes it: a whole number in [0, 2^24). Throws InputError naming `what`.
int32_t token_id(const json& v, const std::string& where, const std::string& what) {
  FSDP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < kMaxTokenId, where, ": ", what,
             " has id ", v.dump(), "; token ids are whole numbers from 0 to ", kMaxTokenId - 1,
             ". The tokenizer.json is damaged");
  return static_cast<int32_t>(v.get<int64_t>());
}

// A boolean field of an object (`fallback` when absent or null). Throws InputError naming `what`.
bool bool_field(const json& j, const char* key, bool fallback, const std::string& where, const std::string& what) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  FSDP_CHECK(it->is_boolean(), where, ": ", what, ": \"", key, "\" must be true or false, not ", it->dump());
  return it->get<bool>();
}

// "String" or "Regex" patterns of Split and Replace.
struct Pattern {
  std::string literal;
  std::shared_ptr<Regex> regex;
  Pattern(const json& j, const std::string& where) {
    if (j.contains("String")) {
      literal = j.at("String").get<std::string>();
      FSDP_CHECK(!literal.empty(), where, ": an empty String pattern");
    } else {
      FSDP_CHECK(j.contains("Regex"), where, ": a pattern needs String or Regex");
      regex = std::make_shared<Regex>(j.at("Regex").get<std::string>(), where);
    }
  }
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const {
    if (regex) return regex->find_all(text);
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t at = text.find(literal); at != std::string_view::npos; at = text.find(literal, at + literal.size()))
      out.emplace_back(at, at + literal.size());
    return out;
  }
};

// --- normalizers ---------------------------------------------------------------------------------

using Normalizer = std::function<std::string(const std::string&)>;

Normalizer make_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return [](const std::string& s) { return s; };
  const std::string type = type_of(j);
  if (type == "Sequence") {
    std::vector<Normalizer> steps;
    for (const json& n : j.at("normalizers")) steps.push_back(make_normalizer(n, where));
    return [steps](const std::string& s) {
      std::string out = s;
      for (const auto& step : steps) out = step(out);
      return out;
    };
  }
  const std::map<std::string, NormalForm> forms = {
      {"NFC", NormalForm::kNFC}, {"NFKC", NormalForm::kNFKC}, {"NFD", NormalForm::kNFD}, {"NFKD", NormalForm::kNFKD}};
  if (auto f = forms.find(type); f != forms.end())
    return [form = f->second](const std::string& s) { return normalize(s, form); };
  if (type == "Prepend")
    return [p = j.at("prepend").get<std::string>()](const std::string& s) { return s.empty() ? s : p + s; };
  if (type == "Replace") {
    const Pattern pattern(j.at("pattern"), where + " normalizer Replace");
    const std::string content = j.at("content").get<std::string>();
    return [pattern, content](const std::string& s) {
      std::string out;
      size_t last = 0;
      for (const auto& [b, e] : pattern.find_all(s)) {
        out.append(s, last, b - last);
        out += content;
        last = e;
      }
      return out + s.substr(last);
    };
  }
  throw InputError(str(where, ": normalizer ", type,
                       " is not supported (fsdptrain reads NFC, NFKC, NFD, NFKD, Prepend, Replace and Sequence)"));
}

// --- pre-tokenizers ------------------------------------------------------------------------------

using PreTokenizer = std::function<std::vector<Piece>(std::vector<Piece>)>;

// Splits each piece at the matches: Isolated keeps matches as pieces of their own, Removed drops them.
std::vector<Piece> split_pieces(const std::vector<Piece>& in, const Pattern& pattern, bool keep_matches) {
  std::vector<Piece> out;
  for (const Piece& p : in) {
    size_t last = 0;
    auto add = [&](size_t b, size_t e) {
      if (e > b) out.push_back({p.text.substr(b, e - b), p.offset + b});
    };
    for (const auto& [b, e] : pattern.find_all(p.text)) {
      add(last, b);
      if (keep_matches) add(b, e);
      last = e;
    }
    add(last, p.text.size());
  }
  return out;
}

PreTokenizer make_byte_level(const json& j) {
  const bool prefix = j.value("add_prefix_space", false), use_regex = j.value("use_regex", true);
  const auto gpt2 = std::make_shared<Pattern>(json{{"Regex", kGpt2Pattern}}, "ByteLevel");
  return [prefix, use_regex, gpt2](std::vector<Piece> pieces) {
    if (prefix)
      for (Piece& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, " ");
    if (use_regex) pieces = split_pieces(pieces, *gpt2, true);
    for (Piece& p : pieces) {
      std::string mapped;
      for (unsigned char c : p.text) mapped += byte_to_char(c);
      p.text = std::move(mapped);
    }
    return pieces;
  };
}

PreTokenizer make_metaspace(const json& j, const std::string& where) {
  const std::string rep = j.value("replacement", std::string("\xE2\x96\x81"));
  std::string scheme = j.value("prepend_scheme", std::string());
  if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
  FSDP_CHECK(scheme == "always" || scheme == "first" || scheme == "never", where, ": Metaspace prepend_scheme ",
             quoted(scheme), " is not one of always, first, never");
  const bool split = j.value("split", true);
  return [rep, scheme, split](std::vector<Piece> pieces) {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      p.text = replace_all(p.text, " ", rep);
      const bool prepend = scheme == "always" || (scheme == "first" && p.offset == 0);
      if (prepend && p.text.compare(0, rep.size(), rep) != 0) p.text.insert(0, rep);
      if (!split) {
        out.push_back(p);
        continue;
      }
      size_t start = 0;  // each piece starts at a replacement (MergedWithNext)
      for (size_t at = p.text.find(rep, 1); at != std::string::npos; at = p.text.find(rep, at + rep.size())) {
        if (at > start) out.push_back({p.text.substr(start, at - start), p.offset + start});
        start = at;
      }
      if (start < p.text.size()) out.push_back({p.text.substr(start), p.offset + start});
    }
    return out;
  };
}

PreTokenizer make_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return [](std::vector<Piece> p) { return p; };
  const std::string type = type_of(j);
  if (type == "Sequence") {
    std::vector<PreTokenizer> steps;
    for (const json& p : j.at("pretokenizers")) steps.push_back(make_pre_tokenizer(p, where));
    return [steps](std::vector<Piece> pieces) {
      for (const auto& step : steps) pieces = step(std::move(pieces));
      return pieces;
    };
  }
  if (type == "Split") {
    const std::string behavior = j.value("behavior", std::string("Isolated"));
    FSDP_CHECK((behavior == "Isolated" || behavior == "Removed") && !j.value("invert", false), where,
               ": Split with behavior ", behavior, j.value("invert", false) ? " and invert" : "",
               " is not supported (fsdptrain reads Isolated and Removed, not inverted)");
    const auto pattern = std::make_shared<Pattern>(j.at("pattern"), where + " pre_tokenizer Split");
    const bool keep = behavior == "Isolated";
    return [pattern, keep](std::vector<Piece> pieces) { return split_pieces(pieces, *pattern, keep); };
  }
  if (type == "ByteLevel") return make_byte_level(j);
  if (type == "Metaspace") return make_metaspace(j, where);
  throw InputError(str(where, ": pre_tokenizer ", type,
                       " is not supported (fsdptrain reads Split, ByteLevel, Metaspace and Sequence)"));
}

// --- decoders ------------------------------------------------------------------------------------

using Decoder = std::function<std::vector<std::string>(std::vector<std::string>)>;

std::vector<std::string> byte_level_decode(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& t : tokens) {
    std::string mine;
    bool all = true;
    for (std::string_view c : code_points(t)) {
      const int b = char_to_byte(c);
      if (b < 0) {
        all = false;
        break;
      }
      mine += static_cast<char>(b);
    }
    bytes += all ? mine : t;
  }
  return {repair_utf8(bytes)};
}

// "<0x41>" -> 0x41; -1 when not a byte token.
int byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  const auto hex = [](char c) {
    return std::isxdigit(static_cast<unsigned char>(c)) ? std::stoi(std::string(1, c), nullptr, 16) : -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::vector<std::string> byte_fallback_decode(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string run;
  size_t run_tokens = 0;
  auto flush = [&] {
    if (run_tokens == 0) return;
    if (first_invalid_utf8(run) == std::string::npos)
      out.push_back(run);
    else
      for (size_t i = 0; i < run_tokens; ++i) out.push_back("\xEF\xBF\xBD");
    run.clear();
    run_tokens = 0;
  };
  for (const std::string& t : tokens) {
    const int b = byte_token(t);
    if (b >= 0) {
      run += static_cast<char>(b);
      ++run_tokens;
    } else {
      flush();
      out.push_back(t);
    }
  }
  flush();
  return out;
}

Decoder make_strip(const json& j) {
  const std::string content = j.at("content").get<std::string>();
  const size_t start = j.at("start").get<size_t>(), stop = j.at("stop").get<size_t>();
  return [content, start, stop](std::vector<std::string> tokens) {
    for (std::string& t : tokens) {
      for (size_t i = 0; i < start && t.compare(0, content.size(), content) == 0; ++i) t.erase(0, content.size());
      for (size_t i = 0;
           i < stop && t.size() >= content.size() && t.compare(t.size() - content.size(), content.size(), content) == 0;
           ++i)
        t.erase(t.size() - content.size());
    }
    return tokens;
  };
}

Decoder make_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return [](std::vector<std::string> tokens) { return std::vector<std::string>{join(tokens, " ")}; };
  const std::string type = type_of(j);
  if (type == "Sequence") {
    std::vector<Decoder> steps;
    for (const json& d : j.at("decoders")) steps.push_back(make_decoder(d, where));
    return [steps](std::vector<std::string> tokens) {
      for (const auto& step : steps) tokens = step(std::move(tokens));
      return tokens;
    };
  }
  if (type == "ByteLevel") return byte_level_decode;
  if (type == "ByteFallback") return byte_fallback_decode;
  if (type == "Fuse") return [](std::vector<std::string> t) { return std::vector<std::string>{join(t, "")}; };
  if (type == "Strip") return make_strip(j);
  if (type == "Replace") {
    const json& p = j.at("pattern");
    FSDP_CHECK(p.contains("String"), where, ": decoder Replace with a Regex pattern is not supported");
    return [from = p.at("String").get<std::string>(),
            to = j.at("content").get<std::string>()](std::vector<std::string> tokens) {
      for (std::string& t : tokens) t = replace_all(t, from, to);
      return tokens;
    };
  }
  if (type == "Metaspace") {
    const std::string rep = j.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = j.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
    return [rep, strip = scheme != "never"](std::vector<std::string> tokens) {
      for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = replace_all(tokens[i], rep, " ");
        if (i == 0 && strip && !tokens[i].empty() && tokens[i][0] == ' ') tokens[i].erase(0, 1);
      }
      return tokens;
    };
  }
  throw InputError(str(where, ": decoder ", type,
                       " is not supported (fsdptrain reads ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace "
                       "and Sequence)"));
}

// --- the BPE model -------------------------------------------------------------------------------

struct Merge {
  int rank = 0;
  int32_t id = 0;  // of the merged token
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;  // the model's and the added tokens
  std::vector<std::string> tokens;                 // by id
  std::vector<bool> special;                       // by id: an added token with special: true
  std::vector<bool> is_added;                      // by id: an added token (its text is its content)
  bool byte_level = false;                         // a ByteLevel pre-tokenizer: tokens are bytes
  std::string metaspace = "\xE2\x96\x81";          // what stands for a space in SentencePiece-style tokens
  std::optional<NormalForm> normal_form;           // the normalizer's Unicode form, if it has one
  // Whether a space is prepended to each stretch of text between added tokens (a Prepend
  // normalizer; Metaspace's "always", unless it starts with one) or to the first only ("first").
  enum class Prepend { kNone, kAlways, kFirst } prepend = Prepend::kNone;
  bool prepend_unless_space = false;  // Metaspace's: not when the stretch starts with a space
  std::unordered_map<uint64_t, Merge> merges;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  int32_t unk = -1;
  std::array<int32_t, 256> byte_ids{};  // <0xNN>'s id, or -1
  struct Added {
    std::string content;
    int32_t id;
    bool lstrip, rstrip, normalized;
  };
  std::vector<Added> added_raw, added_normalized;  // longest first
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  Decoder decoder;
  std::vector<std::pair<bool, int32_t>> template_single;  // (is the sequence, special id)
  bool has_template = false;

  void load_model(const json& m, const std::string& where);
  void load_added(const json& added, const std::string& where);
  void load_post_processor(const json& p, const std::string& where);
  std::vector<Piece> split_added(const Piece& in, const std::vector<Added>& which) const;
  void word_ids(const std::string& word, std::vector<int32_t>& out) const;
  void text_ids(const Piece& piece, std::vector<int32_t>& out) const;
  std::string surface(int32_t id) const;
  void note_components(const json& normalizer, const json& pre_tokenizer);
};

void Tokenizer::Impl::load_model(const json& m, const std::string& where) {
  FSDP_CHECK(type_of(m) == "BPE", where, ": model ", type_of(m),
             " is not supported (fsdptrain reads BPE: the Llama, Mistral, Qwen and GPT-2 tokenizers)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
    FSDP_CHECK(!m.contains(key) || m[key].is_null(), where, ": BPE ", key, " ", m[key].dump(),
               " is not supported (it changes the ids; fsdptrain reads it only when null)");
  for (const auto& [token, id] : m.at("vocab").items())
    vocab[token] = token_id(id, where, "model.vocab token " + json(token).dump());
  byte_fallback = m.value("byte_fallback", false);
  fuse_unk = m.value("fuse_unk", false);
  ignore_merges = m.value("ignore_merges", false);
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    const auto it = vocab.find(m["unk_token"].get<std::string>());
    FSDP_CHECK(it != vocab.end(), where, ": unk_token ", m["unk_token"].dump(), " is not in the vocabulary");
    unk = it->second;
  }
  int rank = 0;
  for (const json& e : m.at("merges")) {
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t space = s.find(' ', 1);
      FSDP_CHECK(space != std::string::npos, where, ": merge ", e.dump(), " is not two tokens");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else {
      a = e.at(0).get<std::string>();
      b = e.at(1).get<std::string>();
    }
    const auto ia = vocab.find(a), ib = vocab.find(b), ab = vocab.find(a + b);
    FSDP_CHECK(ia != vocab.end() && ib != vocab.end() && ab != vocab.end(), where, ": merge ", e.dump(),
               " names a token that is not in the vocabulary");
    merges.emplace(pair_key(ia->second, ib->second), Merge{rank++, ab->second});
  }
  byte_ids.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (const auto it = vocab.find(name); it != vocab.end()) byte_ids[b] = it->second;
  }
}

void Tokenizer::Impl::load_added(const json& added, const std::string& where) {
  FSDP_CHECK(added.is_array(), where, ": added_tokens must be a list");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    const std::string what = str("added_tokens[", i, "]");
    FSDP_CHECK(a.is_object() && a.contains("content") && a["content"].is_string() && a.contains("id"), where, ": ",
               what, " needs a string \"content\" and an \"id\"");
    const std::string content = a["content"].get<std::string>();
    const std::string token = what + " " + json(content).dump();
    FSDP_CHECK(!content.empty(), where, ": ", what, " has empty content; an added token must have text");
    FSDP_CHECK(!bool_field(a, "single_word", false, where, token), where, ": ", token,
               " has single_word: true, which fsdptrain does not support");
    Added t{content, token_id(a["id"], where, token), bool_field(a, "lstrip", false, where, token),
            bool_field(a, "rstrip", false, where, token), bool_field(a, "normalized", false, where, token)};
    vocab[t.content] = t.id;
    if (special.size() <= static_cast<size_t>(t.id)) special.resize(t.id + 1, false);
    special[t.id] = bool_field(a, "special", false, where, token);
    if (is_added.size() <= static_cast<size_t>(t.id)) is_added.resize(t.id + 1, false);
    is_added[t.id] = true;
    (t.normalized ? added_normalized : added_raw).push_back(t);
  }
  for (auto* list : {&added_raw, &added_normalized})
    std::stable_sort(list->begin(), list->end(),
                     [](const Added& x, const Added& y) { return x.content.size() > y.content.size(); });
}

void Tokenizer::Impl::load_post_processor(const json& p, const std::string& where) {
  if (p.is_null()) return;
  const std::string type = type_of(p);
  if (type == "Sequence") {
    for (const json& q : p.at("processors")) load_post_processor(q, where);
    return;
  }
  if (type == "ByteLevel") return;  // offsets only
  FSDP_CHECK(type == "TemplateProcessing", where, ": post_processor ", type,
             " is not supported (fsdptrain reads TemplateProcessing, ByteLevel and Sequence)");
  FSDP_CHECK(!has_template, where, ": two TemplateProcessing post-processors");
  has_template = true;
  for (const json& item : p.at("single")) {
    if (item.contains("Sequence")) {
      template_single.emplace_back(true, -1);
      continue;
    }
    const std::string name = item.at("SpecialToken").at("id").get<std::string>();
    for (const json& id : p.at("special_tokens").at(name).at("ids"))
      template_single.emplace_back(false, token_id(id, where, "post_processor special token " + json(name).dump()));
  }
}

// Splits `in` around the added tokens of `which`: leftmost match first, the longest at a position.
std::vector<Piece> Tokenizer::Impl::split_added(const Piece& in, const std::vector<Added>& which) const {
  if (which.empty()) return {in};
  std::vector<Piece> out;
  const std::string& s = in.text;
  size_t last = 0, at = 0;
  const auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  };
  while (at < s.size()) {
    const Added* hit = nullptr;
    for (const Added& a : which)
      if (s.compare(at, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++at;
      continue;
    }
    size_t b = at, e = at + hit->content.size();
    if (hit->lstrip)
      while (b > last && is_space(s[b - 1])) --b;
    if (hit->rstrip)
      while (e < s.size() && is_space(s[e])) ++e;
    if (b > last) out.push_back({s.substr(last, b - last), in.offset + last});
    out.push_back({s.substr(b, e - b), in.offset + b, hit->id});
    last = at = e;
  }
  if (last < s.size()) out.push_back({s.substr(last), in.offset + last});
  return out;
}

// The BPE model on one pre-tokenized word: its characters (or their bytes, or unk), then the
// lowest-ranked adjacent merge, repeatedly, leftmost first on ties.
void Tokenizer::Impl::word_ids(const std::string& word, std::vector<int32_t>& out) const {
  if (ignore_merges)
    if (const auto it = vocab.find(word); it != vocab.end()) return out.push_back(it->second);
  struct Symbol {
    int32_t id;
    int prev, next;
    bool alive = true;
  };
  std::vector<Symbol> sym;
  auto push = [&](int32_t id, bool is_unk) {
    if (is_unk && fuse_unk && !sym.empty() && sym.back().id == unk) return;
    sym.push_back({id, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1});
  };
  for (std::string_view c : code_points(word)) {
    if (const auto it = vocab.find(std::string(c)); it != vocab.end()) {
      push(it->second, false);
      continue;
    }
    const bool bytes = byte_fallback &&
                       std::all_of(c.begin(), c.end(), [&](char b) { return byte_ids[static_cast<uint8_t>(b)] >= 0; });
    if (bytes)
      for (char b : c) push(byte_ids[static_cast<uint8_t>(b)], false);
    else if (unk >= 0)
      push(unk, true);
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  struct Candidate {
    int rank, left, right;
    int32_t left_id, right_id, id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int l) {
    if (l < 0 || sym[l].next < 0) return;
    const int r = sym[l].next;
    const auto it = merges.find(pair_key(sym[l].id, sym[r].id));
    if (it != merges.end()) heap.push({it->second.rank, l, r, sym[l].id, sym[r].id, it->second.id});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol &l = sym[c.left], &r = sym[c.right];
    if (!l.alive || !r.alive || l.next != c.right || l.id != c.left_id || r.id != c.right_id) continue;
    l.id = c.id;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  for (const Symbol& s : sym)
    if (s.alive) out.push_back(s.id);
}

// Ordinary text: normalized, split around the added tokens that match normalized text,
// pre-tokenized, and each word through the model.
void Tokenizer::Impl::text_ids(const Piece& piece, std::vector<int32_t>& out) const {
  const Piece normalized{normalizer(piece.text), piece.offset};
  for (const Piece& p : split_added(normalized, added_normalized)) {
    if (p.added >= 0) {
      out.push_back(p.added);
      continue;
    }
    for (const Piece& word : pre_tokenizer({p})) word_ids(word.text, out);
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const std::string& path) {
  const std::string file = is_directory(path) ? path + "/tokenizer.json" : path;
  FSDP_CHECK(file_exists(file), "[tokenize] ", quoted(file), " not found",
             is_directory(path) ? "; the model folder has no tokenizer.json (fsdptrain reads Hugging Face's fast "
                                  "tokenizer file, not tokenizer.model)"
                                : "; give a tokenizer.json or a model folder holding one");
  try {
    return parse(read_file(file), file);
  } catch (const nlohmann::json::exception& e) {  // a field of another type than tokenizer.json's
    throw InputError(str("[tokenize] ", file, ": ", json_error_words(e)));
  }
}

Tokenizer Tokenizer::parse(const std::string& json_text, const std::string& where) {
  const json j = parse_json(json_text, "[tokenize] " + where);
  const std::string at = "[tokenize] " + where;
  auto impl = std::make_unique<Impl>();
  try {
    impl->load_model(j.at("model"), at);
    impl->load_added(j.value("added_tokens", json::array()), at);
    impl->normalizer = make_normalizer(j.value("normalizer", json()), at);
    impl->pre_tokenizer = make_pre_tokenizer(j.value("pre_tokenizer", json()), at);
    impl->note_components(j.value("normalizer", json()), j.value("pre_tokenizer", json()));
    impl->decoder = make_decoder(j.value("decoder", json()), at);
    impl->load_post_processor(j.value("post_processor", json()), at);
  } catch (const json::exception& e) {
    throw InputError(str(at, ": not a tokenizer.json this reader understands: ", e.what()));
  }
  int32_t top = -1;
  for (const auto& [token, id] : impl->vocab) top = std::max(top, id);
  // Ids may leave gaps, not a table of holes: the id -> token table is sized by the largest id.
  const int64_t count = static_cast<int64_t>(impl->vocab.size());
  FSDP_CHECK(top < 4 * count + 65536, at, ": the largest token id is ", top, " but the file has only ", count,
             " tokens; ids that sparse mean a damaged file");
  impl->tokens.assign(static_cast<size_t>(top + 1), "");
  std::vector<bool> known(impl->tokens.size(), false);
  for (const auto& [token, id] : impl->vocab) {
    impl->tokens[id] = token;
    known[id] = true;
  }
  impl->special.resize(impl->tokens.size(), false);
  impl->is_added.resize(impl->tokens.size(), false);
  // Every id the template adds must be a token, or it would land in the shards silently.
  for (const auto& [sequence, id] : impl->template_single)
    FSDP_CHECK(sequence || (id < static_cast<int32_t>(known.size()) && known[id]), at,
               ": the post_processor adds special token id ", id, ", which is no token of the vocabulary (", count,
               " tokens); the tokenizer.json is damaged");
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  for (const Piece& p : m.split_added({repair_utf8(text), 0}, m.added_raw)) {
    if (p.added >= 0)
      ids.push_back(p.added);
    else
      m.text_ids(p, ids);
  }
  if (!add_special_tokens || !m.has_template) return ids;
  std::vector<int32_t> out;
  for (const auto& [sequence, id] : m.template_single) {
    if (sequence)
      out.insert(out.end(), ids.begin(), ids.end());
    else
      out.push_back(id);
  }
  return out;
}

// What offsets() needs of the components: a byte-level pre-tokenizer, Metaspace's replacement,
// and a Unicode normal form, wherever they sit in a Sequence.
void Tokenizer::Impl::note_components(const json& n, const json& p) {
  const std::map<std::string, NormalForm> forms = {
      {"NFC", NormalForm::kNFC}, {"NFKC", NormalForm::kNFKC}, {"NFD", NormalForm::kNFD}, {"NFKD", NormalForm::kNFKD}};
  if (n.is_object()) {
    if (n.contains("normalizers"))
      for (const json& step : n["normalizers"]) note_components(step, json());
    if (const auto f = forms.find(n.value("type", std::string())); f != forms.end()) normal_form = f->second;
    if (n.value("type", std::string()) == "Replace" && n.contains("content") && n["content"].is_string() &&
        n["content"].get<std::string>() != " ")
      metaspace = n["content"].get<std::string>();
    if (n.value("type", std::string()) == "Prepend") prepend = Prepend::kAlways;
  }
  if (p.is_object()) {
    if (p.contains("pretokenizers"))
      for (const json& step : p["pretokenizers"]) note_components(json(), step);
    const std::string type = p.value("type", std::string());
    byte_level = byte_level || type == "ByteLevel";
    if (type == "Metaspace") {
      metaspace = p.value("replacement", metaspace);
      std::string scheme = p.value("prepend_scheme", std::string());
      if (scheme.empty()) scheme = p.value("add_prefix_space", true) ? "always" : "never";
      if (scheme != "never") {
        prepend = scheme == "first" ? Prepend::kFirst : Prepend::kAlways;
        prepend_unless_space = true;
      }
    }
  }
}

// The bytes of the input a token stands for, as far as the token says: an added token's content,
// a byte-level token's bytes, or a SentencePiece-style token with its replacement read as a space
// and <0xNN> as that byte.
std::string Tokenizer::Impl::surface(int32_t id) const {
  const std::string& t = tokens[static_cast<size_t>(id)];
  if (is_added[static_cast<size_t>(id)]) return t;
  if (byte_level) {
    std::string bytes;
    for (std::string_view c : code_points(t)) {
      const int b = char_to_byte(c);
      if (b < 0) return t;
      bytes += static_cast<char>(b);
    }
    return bytes;
  }
  if (const int b = byte_token(t); b >= 0) return std::string(1, static_cast<char>(b));
  return replace_all(t, metaspace, " ");
}

std::vector<std::pair<size_t, size_t>> Tokenizer::offsets(std::string_view text,
                                                          const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  std::vector<std::pair<size_t, size_t>> out(ids.size());
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  size_t at = 0;
  // A space the tokenizer prepends to the stretch of text starting here (at the start, and after
  // each added token), not in `text`: the next token spells it first.
  auto prepends_at = [&](size_t pos) {
    return m.prepend != Impl::Prepend::kNone && (m.prepend == Impl::Prepend::kAlways || pos == 0) &&
           pos < text.size() && !(m.prepend_unless_space && text[pos] == ' ');
  };
  bool virtual_space = prepends_at(0);
  for (size_t i = 0; i < ids.size();) {
    const int32_t id = ids[i];
    FSDP_CHECK(id >= 0 && static_cast<size_t>(id) < m.tokens.size(), "[tokenize] id ", id,
               " is outside the vocabulary");
    const std::string s = m.surface(id);
    const bool added = m.is_added[static_cast<size_t>(id)];
    if (virtual_space && !added && !s.empty() && s[0] == ' ' &&
        text.compare(at, s.size() - 1, std::string_view(s).substr(1)) == 0) {
      // tokenizers aligns the prepended space with the character it was prepended to, so a token
      // that is nothing else covers that character too.
      const size_t own = s.size() == 1 ? code_points(text.substr(at, 4)).front().size() : 0;
      out[i++] = {at, at + std::max(s.size() - 1, own)};
      at += s.size() - 1;
      virtual_space = false;
      continue;
    }
    if (text.compare(at, s.size(), s) == 0) {  // the token's bytes, as they are
      out[i++] = {at, at + s.size()};
      at += s.size();
      virtual_space = added && prepends_at(at);
      continue;
    }
    if (id == m.unk && at < text.size()) {  // (not the literal text of an added unk token: matched above)
      // An unknown character (several, with fuse_unk: up to where the next token's text begins).
      const size_t begin = at;
      do {
        at += code_points(text.substr(at, 4)).front().size();
      } while (m.fuse_unk && at < text.size() && i + 1 < ids.size() &&
               text.compare(at, m.surface(ids[i + 1]).size(), m.surface(ids[i + 1])) != 0);
      out[i++] = {begin, at};
      virtual_space = false;
      continue;
    }
    if (m.is_added[static_cast<size_t>(id)] && at < text.size() && is_space(text[at])) {
      ++at;  // whitespace an added token stripped (lstrip/rstrip) belongs to no token
      continue;
    }
    // Text the normalizer changed: tokens and characters taken together until both spell the same
    // normalized text. As tokenizers aligns it, normalized character t came from source character t
    // (a composed character from the first of its parts; extra characters from the last), and a
    // token covers the source characters of the normalized characters it spells.
    if (!m.normal_form) {
      // Most often a character the vocabulary cannot spell, which the model dropped (a byte-level
      // BPE trained without the byte alphabet; transformers drops it without a word).
      const std::string_view c = at < text.size() ? code_points(text.substr(at, 4)).front() : std::string_view();
      char code[16] = "";
      if (!c.empty()) {
        const unsigned char lead = static_cast<unsigned char>(c[0]);
        uint32_t v = c.size() == 1 ? lead : c.size() == 2 ? lead & 0x1F : c.size() == 3 ? lead & 0x0F : lead & 0x07;
        for (size_t b = 1; b < c.size(); ++b) v = (v << 6) | (static_cast<unsigned char>(c[b]) & 0x3F);
        std::snprintf(code, sizeof(code), "U+%04X", static_cast<unsigned>(v));
      }
      throw InputError(
          str("[tokenize] the tokenizer has no token for ",
              c.empty() ? std::string("the end of the text") : str("the character \"", c, "\" (", code, ")"),
              " at byte ", at,
              " of the text: its vocabulary cannot spell it, so the text would lose it "
              "(transformers drops it silently). Remove the character from the data, or use a tokenizer "
              "whose vocabulary covers it (a byte-level BPE with all 256 bytes does)"));
    }
    const std::vector<std::string_view> chars = code_points(text.substr(at));
    std::string spelled = s, raw;
    size_t j = i + 1, k = 0, end = at;
    while (true) {
      const std::string normalized = normalize(raw, *m.normal_form);
      if (!raw.empty() && normalized == spelled) break;
      FSDP_CHECK(j - i < 64 && k < 64, "[tokenize] the tokens do not spell the text at byte ", at);
      if (normalized.size() < spelled.size() || raw.empty()) {
        FSDP_CHECK(k < chars.size(), "[tokenize] the tokens run past the text at byte ", at);
        raw += chars[k];
        end += chars[k++].size();
      } else {
        FSDP_CHECK(j < ids.size(), "[tokenize] the tokens end before the text at byte ", at);
        spelled += m.surface(ids[j++]);
      }
    }
    std::vector<size_t> starts;  // each source character's byte offset, then the end
    for (size_t c = 0, b = at; c < k; b += chars[c++].size()) starts.push_back(b);
    starts.push_back(end);
    std::vector<size_t> char_of(spelled.size());  // normalized byte -> its normalized character
    for (size_t b = 0, c = 0; b < spelled.size(); ++b) {
      if (b > 0 && (static_cast<unsigned char>(spelled[b]) & 0xC0) != 0x80) ++c;
      char_of[b] = std::min(c, k - 1);
    }
    for (size_t b = 0; i < j; ++i) {
      const size_t n = m.surface(ids[i]).size();
      out[i] = n == 0 ? std::make_pair(starts[char_of[std::min(b, spelled.size() - 1)]],
                                       starts[char_of[std::min(b, spelled.size() - 1)]])
                      : std::make_pair(starts[char_of[b]], starts[char_of[b + n - 1] + 1]);
      b += n;
    }
    at = end;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  for (int32_t id : ids) {
    FSDP_CHECK(id >= 0 && static_cast<size_t>(id) < m.tokens.size(), "[tokenize] id ", id,
               " is outside the vocabulary (", m.tokens.size(), " tokens)");
    if (skip_special_tokens && m.special[id]) continue;
    tokens.push_back(m.tokens[id]);
  }
  return join(m.decoder(std::move(tokens)), "");
}

int64_t Tokenizer::vocab_size() const {
  return static_cast<int64_t>(impl_->tokens.size());
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->is_added.size() && impl_->is_added[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->tokens.size()) return std::nullopt;
  return impl_->tokens[id];
}

}  // namespace fsdp::tokenize

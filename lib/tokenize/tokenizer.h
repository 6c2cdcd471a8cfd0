// A Hugging Face tokenizer.json, read natively: the ids of Tokenizer.from_file(path).encode(text).ids
// from the Python `tokenizers` package, for the tokenizers of the models fsdptrain trains (Llama 3,
// GPT-2, Qwen2/2.5/3: ByteLevel BPE with a split regex and NFC; Llama 2, Mistral: SentencePiece-style
// BPE with byte fallback, through Prepend/Replace normalizers or a Metaspace pre-tokenizer).
//
// Encoding, as `tokenizers` does it: added tokens are split out of the raw text first (those with
// normalized: false; the others after normalization), then each remaining piece is normalized,
// pre-tokenized into words, each word is turned into ids by the BPE model, and the post-processor
// adds its template (BOS). Decoding runs the decoder chain over the tokens' strings.
//
// Anything else in the file (another model, normalizer, pre-tokenizer, post-processor or decoder,
// or a BPE option that changes the ids) is refused naming the component, never mis-tokenized.
// Text that is not valid UTF-8 is read with each bad sequence replaced by U+FFFD, as Python's
// errors="replace". Immutable after loading; encode/decode are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::tokenize {

class Tokenizer {
 public:
  // `path`: a tokenizer.json, or a folder holding one (a Hugging Face model folder). Throws
  // InputError naming the file and the component it cannot honour.
  static Tokenizer load(const std::string& path);
  // The same from the file's text; `where` names it in errors.
  static Tokenizer parse(const std::string& json_text, const std::string& where);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // The ids of `text`; with add_special_tokens, the post-processor's template (e.g. BOS) too.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Each of `ids`' byte span [begin, end) in `text`, for ids that encode(text, false) gave: what
  // tokenizers' offsets say, in bytes. Tokens that split one character (byte-level BPE) each get
  // their bytes; tokens of text the normalizer changed (a character NFC composes) share the span of
  // the characters they came from; a space a pre-tokenizer prepended covers nothing. Throws Error
  // when the ids do not spell `text` (ids of another text). `text` must be valid UTF-8.
  std::vector<std::pair<size_t, size_t>> offsets(std::string_view text, const std::vector<int32_t>& ids) const;
  // The text of `ids`, special tokens left out unless skip_special_tokens is false.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;

  int64_t vocab_size() const;       // the largest id + 1, added tokens included
  bool is_added(int32_t id) const;  // an added token (<|im_end|>, <|eot_id|>, ...): split out of text whole
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::tokenize

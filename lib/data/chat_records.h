// Conversation records tokenized for training: each rendered with the model's chat template
// (chat/chat_template.h) and tokenized as apply_chat_template(tokenize=True) does (no special
// tokens added: the template writes BOS where the model wants it; no EOS appended: the template
// ends each turn itself), the loss's character spans mapped to tokens as transformers maps its
// assistant mask: from the token holding a span's first character through the token holding its
// last (tokenize::Tokenizer::offsets), a span whose first character no token holds ending the
// marking, as in transformers.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "chat/chat_template.h"
#include "tokenize/tokenizer.h"

namespace fsdp::data {

struct ChatOptions {
  std::string folder;           // holds the template (the tokenizer's folder)
  std::string template_file;    // data.chat_template: a .jinja file instead ("": the folder's)
  bool assistant_only = true;   // data.assistant_only_loss
  chat::TemplateLimits limits;  // data.chat_template_max_*
};

class ChatEncoder {
 public:
  ChatEncoder(const ChatOptions& options, const tokenize::Tokenizer& tokenizer);

  struct Encoded {
    std::vector<int32_t> ids;
    std::vector<uint8_t> counted;  // a byte per id: 1 when the loss counts it
  };
  // `record`: a JSONL line holding a conversation; `where`: "file:line" for errors (a record that
  // is not one, the template's raise_exception, a turn whose span cannot be found).
  Encoded encode(const std::string& record, const std::string& where) const;

  const chat::ChatTemplate& chat_template() const { return template_; }
  const ChatOptions& options() const { return options_; }

 private:
  ChatOptions options_;
  const tokenize::Tokenizer& tokenizer_;
  chat::ChatTemplate template_;
};

// The tokens counted for byte spans of `text`, given each token's byte span (transformers' rule).
std::vector<uint8_t> counted_tokens(const std::string& text, const std::vector<std::pair<size_t, size_t>>& offsets,
                                    const std::vector<std::pair<size_t, size_t>>& spans);

}  // namespace fsdp::data

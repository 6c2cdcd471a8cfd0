#include "data/chat_records.h"

#include "util/error.h"
#include "util/json.h"
#include "util/strings.h"

namespace fsdp::data {

ChatEncoder::ChatEncoder(const ChatOptions& options, const tokenize::Tokenizer& tokenizer)
    : options_(options),
      tokenizer_(tokenizer),
      template_(chat::ChatTemplate::load(options.folder, options.template_file, options.limits)) {}

ChatEncoder::Encoded ChatEncoder::encode(const std::string& record, const std::string& where) const {
  chat::ChatTemplate::Training t;
  Encoded out;
  try {
    const chat::Json j = parse_ordered_json(record, "the record");  // bounded nesting
    t = template_.render_for_training(chat::read_conversation(j), options_.assistant_only);
    out.ids = tokenizer_.encode(t.text, /*add_special_tokens=*/false);
    out.counted = counted_tokens(t.text, tokenizer_.offsets(t.text, out.ids), t.counted);
  } catch (const chat::TemplateRaise& e) {
    throw InputError(str("[data] ", where, ": the chat template (", e.where(), ":", e.line(), ") refuses this ",
                         "conversation: ", e.what()));
  } catch (const chat::Json::exception& e) {
    throw InputError(str("[data] ", where, ": ", json_error_words(e)));
  } catch (const InputError& e) {
    throw InputError(str("[data] ", where, ": ", e.what()));
  }
  return out;
}

std::vector<uint8_t> counted_tokens(const std::string& text, const std::vector<std::pair<size_t, size_t>>& offsets,
                                    const std::vector<std::pair<size_t, size_t>>& spans) {
  std::vector<uint8_t> counted(offsets.size(), 0);
  std::vector<int64_t> token_at(text.size(), -1);  // byte -> the first token holding it
  for (size_t t = offsets.size(); t-- > 0;)
    for (size_t b = offsets[t].first; b < offsets[t].second && b < text.size(); ++b)
      token_at[b] = static_cast<int64_t>(t);
  auto char_start = [&](size_t b) {  // the first byte of the character holding byte b
    while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
    return b;
  };
  for (const auto& [begin, end] : spans) {
    if (end <= begin || begin >= text.size()) continue;
    const int64_t first = token_at[char_start(begin)];
    if (first < 0) break;  // transformers stops marking at a span no token starts
    const int64_t last = token_at[char_start(end - 1)];
    const size_t stop = last < 0 ? counted.size() : static_cast<size_t>(last) + 1;
    for (size_t t = static_cast<size_t>(first); t < stop; ++t) counted[t] = 1;
  }
  return counted;
}

}  // namespace fsdp::data

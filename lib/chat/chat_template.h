// A model's chat template, rendered as transformers' apply_chat_template renders it, and the parts
// of a rendered conversation the loss counts.
//
// Where the template comes from (as transformers loads a folder): chat_template.jinja, else
// tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"}: "tool_use"
// for a conversation with tools when there is one, else "default"); or a file given instead (TRL's
// *_training.jinja variants, say). The variables: messages (conversation.h), tools, documents (none),
// add_generation_prompt, the special tokens of tokenizer_config.json and special_tokens_map.json
// (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token), and the record's
// chat_template_kwargs.
//
// What the loss counts, with assistant_only (TRL's assistant_only_loss, and the default):
//   - a template with {% generation %} blocks: what they produce (transformers' assistant mask);
//   - conversational prompt/completion: the completion, after the prompt rendered with
//     add_generation_prompt (TRL's completion_only_loss);
//   - otherwise each assistant message i: from the end of the rendering of the messages before it
//     with add_generation_prompt to the end of the rendering through message i, so the end-of-turn
//     marker the template writes after the message is learned too. Where a template renders the
//     conversation differently once later messages follow (Qwen3 drops the reasoning of assistant
//     turns before the last user message; Mistral moves the system prompt into the last user
//     message), those renderings are not prefixes of the whole: the turn is then its content
//     followed by what the template writes after it as the last turn (its end-of-turn marker),
//     found in the whole rendering after the turns before it, starting where the generation prompt
//     ends when that is still a prefix, else at the content. A turn found neither way is refused,
//     naming a template with generation blocks or the option to count every token.
// Without assistant_only, every character counts.
//
// Immutable after loading: render() may run on several threads at once.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "chat/conversation.h"
#include "chat/jinja.h"

namespace fsdp::chat {

class ChatTemplate {
 public:
  // `folder`: a model or tokenizer folder; `file`: a template file used instead ("": none). Throws
  // InputError naming the folder when it has no template, or the file and line of a template the
  // engine cannot read. Every render runs within `limits`.
  static ChatTemplate load(const std::string& folder, const std::string& file = "", const TemplateLimits& limits = {});

  // The conversation rendered (the prompt of a generation with add_generation_prompt).
  std::string render(const Conversation& c, bool add_generation_prompt) const;

  struct Training {
    std::string text;
    std::vector<std::pair<size_t, size_t>> counted;  // byte spans [begin, end) of `text`, ascending
    // How they were found: "every token", "the completion", "generation blocks", "prefixes" (each
    // turn between the renderings before and through it), or "content search" (a turn found by its
    // content where the renderings are no prefixes).
    std::string rule;
  };
  // The text a conversation trains on and the spans its loss counts. Throws TemplateRaise for the
  // template's raise_exception, InputError for a turn the spans cannot be found for.
  Training render_for_training(const Conversation& c, bool assistant_only) const;

  bool has_generation_blocks() const { return generation_blocks_; }
  const std::string& where() const { return where_; }
  // The template sources and variables: what decides every rendering (for cache keys).
  std::string identity() const;
  // The special tokens' strings by name (bos_token, ...): the ids a chat generation stops at.
  const Json& special_tokens() const { return specials_; }

 private:
  ChatTemplate() = default;
  const Template& pick(const Conversation& c) const;
  Template::Output run(const Conversation& c, size_t messages, bool add_generation_prompt) const;
  std::vector<std::pair<size_t, size_t>> assistant_spans(const Conversation& c, const std::string& whole,
                                                         std::string* rule) const;

  std::vector<std::pair<std::string, Template>> templates_;  // by name; "default" first when there is one
  std::vector<std::string> sources_;
  Json specials_ = Json::object();
  std::string where_;
  bool generation_blocks_ = false;
};

}  // namespace fsdp::chat

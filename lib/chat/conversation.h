// Conversations as TRL reads them from a JSONL record, and what transformers hands a chat template.
//
// A record is one of TRL's conversational formats, recognised record by record:
//   {"messages": [{"role": ..., "content": ...}, ...]}                     conversational language modeling
//   {"prompt": [messages...], "completion": [messages...]}                conversational prompt/completion
//   {"conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}   ShareGPT, converted as TRL's
//                                                                         maybe_convert_to_chatml does
// with optional "tools" (a list of JSON schemas, passed to the template) and "chat_template_kwargs"
// (an object of extra template variables). Messages are given to the template as transformers gives
// them: keys whose value is null dropped, and a reasoning field (reasoning_content, thinking or
// reasoning) copied under thinking and reasoning_content.
#pragma once

#include <optional>
#include <string>

#include "chat/jinja.h"

namespace fsdp::chat {

struct Conversation {
  Json messages = Json::array();
  Json tools;                    // null, or the record's list
  Json kwargs = Json::object();  // chat_template_kwargs
  size_t prompt_messages = 0;    // conversational prompt/completion: the prompt's messages; 0 otherwise
  bool prompt_completion() const { return prompt_messages > 0; }
};

// Whether a record has one of the conversational keys (messages, conversations, or a prompt that is
// a list): then it is read as a conversation, or refused.
bool is_conversation(const Json& record);

// The conversation of a record for which is_conversation() holds. Throws InputError saying what
// is wrong (the caller names the file and line): a message that is not an object with a string
// role, an empty list, a prompt list without a completion list, tools that are not a list; with
// for_training, a conversation without an assistant message. ShareGPT's roles (human, gpt) become
// user and assistant, under either key, as TRL maps them.
Conversation read_conversation(const Json& record, bool for_training = true);

// The messages as transformers hands them to the template (see above).
Json template_messages(const Json& messages);

}  // namespace fsdp::chat

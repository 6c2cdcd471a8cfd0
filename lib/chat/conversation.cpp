#include "chat/conversation.h"

#include <algorithm>

#include "util/error.h"
#include "util/strings.h"

namespace fsdp::chat {

namespace {

const char* const kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};

// ShareGPT's speakers, as TRL names them.
std::string sharegpt_role(const std::string& from) {
  if (from == "human") return "user";
  if (from == "gpt") return "assistant";
  return from;  // system, and anything else, as it is
}

Json read_messages(const Json& list, const char* key, bool sharegpt) {
  FSDP_CHECK(list.is_array() && !list.empty(), "\"", key, "\" must be a non-empty list of messages");
  Json out = Json::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& m = list[i];
    FSDP_CHECK(m.is_object(), "\"", key, "\"[", i, "] is not an object (a message has a role and a content)");
    Json message = Json::object();
    for (const auto& [k, v] : m.items()) {
      if (sharegpt && k == "from") {
        FSDP_CHECK(v.is_string(), "\"", key, "\"[", i, "].from must be a string");
        message["role"] = sharegpt_role(v.get<std::string>());
      } else if (sharegpt && k == "value") {
        message["content"] = v;
      } else {
        message[k] = v;
      }
    }
    FSDP_CHECK(message.contains("role") && message["role"].is_string(), "\"", key, "\"[", i, "] has no string \"",
               sharegpt ? "from" : "role", "\"");
    message["role"] = sharegpt_role(message["role"].get<std::string>());  // human, gpt: as TRL maps ShareGPT's
    out.push_back(std::move(message));
  }
  return out;
}

}  // namespace

bool is_conversation(const Json& record) {
  if (!record.is_object()) return false;
  auto list = [&](const char* k) { return record.contains(k) && record[k].is_array(); };
  return list("messages") || list("conversations") || list("prompt") || list("completion");
}

Conversation read_conversation(const Json& record, bool for_training) {
  Conversation c;
  if (record.contains("messages")) {
    c.messages = read_messages(record["messages"], "messages", false);
  } else if (record.contains("conversations")) {
    c.messages = read_messages(record["conversations"], "conversations", true);
  } else {
    FSDP_CHECK(record.contains("prompt") && record.contains("completion") && record["prompt"].is_array() &&
                   record["completion"].is_array(),
               "a conversational prompt/completion record needs \"prompt\" and \"completion\" both lists of messages");
    c.messages = read_messages(record["prompt"], "prompt", false);
    c.prompt_messages = c.messages.size();
    for (Json& m : read_messages(record["completion"], "completion", false)) c.messages.push_back(std::move(m));
  }
  bool answered = false;
  std::vector<std::string> roles;
  for (const Json& m : c.messages) {
    answered = answered || m["role"] == "assistant";
    if (std::find(roles.begin(), roles.end(), m["role"].get<std::string>()) == roles.end()) roles.push_back(m["role"]);
  }
  FSDP_CHECK(answered || !for_training, "the conversation has no \"assistant\" message (its roles: ", join(roles, ", "),
             "), so it holds nothing to learn to answer; give each conversation an assistant turn, or train on the "
             "text as documents");
  if (record.contains("tools") && !record["tools"].is_null()) {
    FSDP_CHECK(record["tools"].is_array(), "\"tools\" must be a list of tool schemas");
    c.tools = record["tools"];
  }
  if (record.contains("chat_template_kwargs") && !record["chat_template_kwargs"].is_null()) {
    FSDP_CHECK(record["chat_template_kwargs"].is_object(), "\"chat_template_kwargs\" must be an object");
    c.kwargs = record["chat_template_kwargs"];
  }
  return c;
}

Json template_messages(const Json& messages) {
  Json out = Json::array();
  for (const Json& m : messages) {
    Json kept = Json::object();
    for (const auto& [k, v] : m.items())
      if (!v.is_null()) kept[k] = v;
    const Json* reasoning = nullptr;
    for (const char* f : kReasoningFields)
      if (kept.contains(f)) {
        reasoning = &kept[f];
        break;
      }
    if (reasoning) {  // {"thinking": r, **message, "reasoning_content": r}, in that key order
      const Json r = *reasoning;
      Json aliased = Json::object();
      aliased["thinking"] = r;
      for (const auto& [k, v] : kept.items()) aliased[k] = v;  // the message's own thinking wins
      aliased["reasoning_content"] = r;
      kept = std::move(aliased);
    }
    out.push_back(std::move(kept));
  }
  return out;
}

}  // namespace fsdp::chat

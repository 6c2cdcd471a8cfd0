#include "chat/chat_template.h"

#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/regex.h"
#include "util/strings.h"

namespace fsdp::chat {

namespace {

const char* const kSpecialTokens[] = {"bos_token",  "sep_token", "pad_token", "cls_token",
                                      "mask_token", "unk_token", "eos_token"};

// A special token's string: tokenizer_config.json writes it as a string or as {"content": ...}.
std::optional<std::string> token_string(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::string& folder, const std::string& file, const TemplateLimits& limits) {
  ChatTemplate t;
  const std::string config_path = folder + "/tokenizer_config.json";
  const std::optional<nlohmann::json> config = try_read_json_file(config_path);
  auto add = [&](const std::string& name, const std::string& source, const std::string& where) {
    t.templates_.emplace_back(name, Template(source, where, limits));
    t.sources_.push_back(name + "\n" + source);
  };
  if (!file.empty()) {
    FSDP_CHECK(file_exists(file), "[chat] the chat template file ", quoted(file), " is ", file_problem(file));
    add("default", read_file(file), file);
    t.where_ = file;
  } else if (file_exists(folder + "/chat_template.jinja")) {
    t.where_ = folder + "/chat_template.jinja";
    add("default", read_file(t.where_), t.where_);
  } else if (config && config->is_object() && config->contains("chat_template")) {
    const nlohmann::json& ct = (*config)["chat_template"];
    t.where_ = config_path + ":chat_template";
    if (ct.is_string()) add("default", ct.get<std::string>(), t.where_);
    if (ct.is_array())
      for (const nlohmann::json& named : ct)
        if (named.is_object() && named.value("name", "").size() && named.contains("template") &&
            named["template"].is_string())
          add(named["name"].get<std::string>(), named["template"].get<std::string>(),
              str(t.where_, "[", named["name"].get<std::string>(), "]"));
  }
  FSDP_CHECK(!t.templates_.empty(), "[chat] ", folder,
             " has no chat template (neither chat_template.jinja nor a chat_template in tokenizer_config.json); "
             "give one with data.chat_template (a .jinja file), or use text or prompt/completion records");
  std::stable_partition(t.templates_.begin(), t.templates_.end(), [](const auto& n) { return n.first == "default"; });
  static const Regex generation(R"(\{%[-+]?\s*generation\s*[-+]?%\})", "the {% generation %} tag");
  for (const std::string& s : t.sources_)
    t.generation_blocks_ = t.generation_blocks_ || !generation.find_all(s).empty();
  // Special tokens: tokenizer_config.json's, then special_tokens_map.json's for those it lacks.
  for (const std::string& path : {config_path, folder + "/special_tokens_map.json"}) {
    const std::optional<nlohmann::json> j = try_read_json_file(path);
    if (!j || !j->is_object()) continue;
    for (const char* name : kSpecialTokens)
      if (j->contains(name) && !t.specials_.contains(name))
        if (const auto s = token_string((*j)[name])) t.specials_[name] = *s;
  }
  return t;
}

const Template& ChatTemplate::pick(const Conversation& c) const {
  if (!c.tools.is_null())
    for (const auto& [name, t] : templates_)
      if (name == "tool_use") return t;
  FSDP_CHECK(templates_.front().first == "default", "[chat] ", where_,
             " has named templates but no \"default\" one for a conversation without tools");
  return templates_.front().second;
}

Template::Output ChatTemplate::run(const Conversation& c, size_t messages, bool add_generation_prompt) const {
  Json upto = Json::array();
  for (size_t i = 0; i < messages; ++i) upto.push_back(c.messages[i]);
  Json v = Json::object();
  v["messages"] = template_messages(upto);
  v["tools"] = c.tools;
  v["documents"] = nullptr;
  v["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [k, s] : specials_.items()) v[k] = s;
  for (const auto& [k, x] : c.kwargs.items()) v[k] = x;  // the record's variables win, as in transformers
  return pick(c).render(v);
}

std::string ChatTemplate::render(const Conversation& c, bool add_generation_prompt) const {
  return run(c, c.messages.size(), add_generation_prompt).text;
}

std::vector<std::pair<size_t, size_t>> ChatTemplate::assistant_spans(const Conversation& c, const std::string& whole,
                                                                     std::string* rule) const {
  std::vector<std::pair<size_t, size_t>> spans;
  *rule = "prefixes";
  size_t searched = 0;  // turns are found in order
  for (size_t i = 0; i < c.messages.size(); ++i) {
    if (c.messages[i].value("role", "") != "assistant") continue;
    std::string before;  // the messages before it, with the generation prompt
    if (i > 0) before = run(c, i, true).text;
    const std::string through = run(c, i + 1, false).text;
    const bool before_prefix = starts_with(whole, before) && before.size() >= searched;
    if (before_prefix && starts_with(whole, through) && through.size() >= before.size()) {
      spans.emplace_back(before.size(), through.size());
      searched = through.size();
      continue;
    }
    // The template renders the conversation differently once later messages follow (Qwen3 drops
    // earlier reasoning; Mistral moves the system prompt into the last user message): the turn is
    // its content followed by what the template writes after it as the last turn (its end-of-turn
    // marker), found in the whole rendering; it starts where the generation prompt ends when that
    // is still a prefix, else at its content.
    const Json& content = c.messages[i].contains("content") ? c.messages[i]["content"] : Json();
    std::string text = content.is_string() ? content.get<std::string>() : "";
    const size_t in_through = text.empty() ? std::string::npos : through.rfind(text);
    const std::string after = in_through == std::string::npos ? "" : through.substr(in_through + text.size());
    const size_t from = before_prefix ? before.size() : searched;
    size_t at = after.empty() ? std::string::npos : whole.find(text + after, from);
    if (at == std::string::npos && text.find("</think>") != std::string::npos) {
      // Reasoning written into the content: Qwen3 keeps only what follows </think> in earlier turns.
      text = text.substr(text.rfind("</think>") + 8);
      text.erase(0, std::min(text.size(), text.find_first_not_of('\n')));
      at = after.empty() || text.empty() ? std::string::npos : whole.find(text + after, from);
    }
    *rule = "content search";
    size_t end = at + text.size() + after.size();
    if (at == std::string::npos && !text.empty() && (at = whole.find(text, from)) != std::string::npos) {
      // What follows the last turn differs from what follows this one (Phi-3 ends the conversation
      // with EOS after the end-of-turn marker): the content, and as much of that as follows it here.
      // Cut back to the end of a whole marker (a '>' or a newline): "<|end|>\n<|user|>" and
      // "<|end|>\n</s>" share "<|end|>\n<", whose last '<' begins the next turn.
      const size_t content_end = at + text.size();
      size_t k = 0;
      while (k < after.size() && content_end + k < whole.size() && whole[content_end + k] == after[k]) ++k;
      while (k > 0 && after[k - 1] != '>' && after[k - 1] != '\n') --k;
      end = content_end + k;
    }
    FSDP_CHECK(at != std::string::npos, "[chat] assistant message ", i,
               ": the template renders it differently once later messages follow, and its content cannot be "
               "found in the whole rendering; give a template with {% generation %} blocks (data.chat_template) "
               "or set data.assistant_only_loss: false");
    spans.emplace_back(before_prefix ? before.size() : at, end);
    searched = spans.back().second;
  }
  return spans;
}

ChatTemplate::Training ChatTemplate::render_for_training(const Conversation& c, bool assistant_only) const {
  Training t;
  const Template::Output whole = run(c, c.messages.size(), false);
  t.text = whole.text;
  if (!assistant_only) {
    t.rule = "every token";
    if (!t.text.empty()) t.counted.emplace_back(0, t.text.size());
  } else if (c.prompt_completion()) {
    const std::string prompt = run(c, c.prompt_messages, true).text;
    FSDP_CHECK(starts_with(t.text, prompt),
               "[chat] the prompt rendered with add_generation_prompt is not how the "
               "prompt and completion together begin, so the completion cannot be found; check the template");
    t.counted.emplace_back(prompt.size(), t.text.size());
    t.rule = "the completion";
  } else if (generation_blocks_) {
    t.counted = whole.generation_spans;
    t.rule = "generation blocks";
  } else {
    t.counted = assistant_spans(c, t.text, &t.rule);
  }
  return t;
}

std::string ChatTemplate::identity() const {
  std::string s = join(sources_, "\n\x1f");
  for (const auto& [k, v] : specials_.items()) s += "\n" + k + "=" + v.get<std::string>();
  return s;
}

}  // namespace fsdp::chat

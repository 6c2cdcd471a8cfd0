// Conversation records and the spans their loss counts (issue 30), without Python: TRL's formats
// read as TRL reads them, the messages as transformers hands them to a template, the span rules of
// chat/chat_template.h on small templates, and transformers' rule from spans to tokens.
#include "chat/conversation.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "chat/chat_template.h"
#include "data/chat_records.h"
#include "util/error.h"

using namespace fsdp;
using chat::ChatTemplate;
using chat::Conversation;
using chat::Json;

namespace {

// A folder holding tokenizer_config.json with `tmpl` as its chat_template.
struct TemplateFolder {
  std::string path;
  explicit TemplateFolder(const std::string& tmpl) {
    char name[] = "/tmp/fsdp_chat_XXXXXX";
    path = ::mkdtemp(name);
    std::ofstream(path + "/tokenizer_config.json")
        << Json{{"chat_template", tmpl}, {"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}}}}.dump();
  }
  ~TemplateFolder() { (void)!std::system(("rm -rf " + path).c_str()); }
};

// The counted text of each span.
std::vector<std::string> counted(const ChatTemplate::Training& t) {
  std::vector<std::string> out;
  for (const auto& [b, e] : t.counted) out.push_back(t.text.substr(b, e - b));
  return out;
}

const char* const kChatML =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

}  // namespace

TEST_CASE("TRL's formats: messages, ShareGPT as maybe_convert_to_chatml converts it, prompt/completion lists") {
  const Conversation m = chat::read_conversation(
      Json::parse(
          R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}], "chat_template_kwargs": {"x": 1}})"),
      /*for_training=*/false);  // a prompt to answer
  CHECK(m.messages.size() == 1);
  CHECK(m.tools.size() == 1);
  CHECK(m.kwargs["x"] == 1);
  CHECK_FALSE(m.prompt_completion());
  const Conversation s = chat::read_conversation(Json::parse(
      R"({"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})"));
  CHECK(s.messages.dump() ==
        R"([{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","content":"a"}])");
  const Conversation pc = chat::read_conversation(Json::parse(
      R"({"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]})"));
  CHECK(pc.prompt_messages == 1);
  CHECK(pc.messages.size() == 2);
  CHECK_THROWS_WITH_AS(chat::read_conversation(Json::parse(R"({"messages": [{"content": "no role"}]})")),
                       doctest::Contains("\"messages\"[0] has no string \"role\""), InputError);
  CHECK_THROWS_WITH_AS(chat::read_conversation(Json::parse(R"({"prompt": [{"role": "user", "content": "q"}]})")),
                       doctest::Contains("needs \"prompt\" and \"completion\" both lists"), InputError);
  CHECK_THROWS_WITH_AS(chat::read_conversation(Json::parse(R"({"messages": []})")), doctest::Contains("non-empty list"),
                       InputError);
}

TEST_CASE(
    "issue 40: a training conversation without an assistant turn is refused; ShareGPT roles inside messages map") {
  CHECK_THROWS_WITH_AS(chat::read_conversation(Json::parse(
                           R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]})")),
                       "the conversation has no \"assistant\" message (its roles: system, user), so it holds nothing "
                       "to learn to answer; "
                       "give each conversation an assistant turn, or train on the text as documents",
                       InputError);
  const Conversation mapped = chat::read_conversation(
      Json::parse(R"({"messages": [{"role": "human", "content": "q"}, {"role": "gpt", "content": "a"}]})"));
  CHECK(mapped.messages.dump() == R"([{"role":"user","content":"q"},{"role":"assistant","content":"a"}])");
}

TEST_CASE("messages reach the template as transformers hands them: nulls dropped, reasoning aliased") {
  const Json in = Json::parse(
      R"([{"role": "assistant", "content": "a", "tool_calls": null, "reasoning": "r"}, {"role": "user", "content": "q"}])");
  CHECK(chat::template_messages(in).dump() ==
        R"([{"thinking":"r","role":"assistant","content":"a","reasoning":"r","reasoning_content":"r"},)"
        R"({"role":"user","content":"q"}])");
}

TEST_CASE("the assistant's turns: by prefixes, by generation blocks, the completion, or every character") {
  TemplateFolder chatml(kChatML);
  const ChatTemplate t = ChatTemplate::load(chatml.path);
  Conversation c = chat::read_conversation(Json::parse(
      R"({"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                       {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]})"));
  CHECK(counted(t.render_for_training(c, true)) == std::vector<std::string>{"a1<|im_end|>\n", "a2<|im_end|>\n"});
  CHECK(counted(t.render_for_training(c, false)) == std::vector<std::string>{t.render(c, false)});
  c.prompt_messages = 3;  // conversational prompt/completion: the completion only
  CHECK(counted(t.render_for_training(c, true)) == std::vector<std::string>{"a2<|im_end|>\n"});

  // {% generation %} blocks decide, as transformers' assistant mask.
  TemplateFolder gen(
      "{% for m in messages %}{{ m.role }}:{% if m.role == 'assistant' %}{% generation %}"
      "{{ m.content }};{% endgeneration %}{% else %}{{ m.content }};{% endif %}{% endfor %}");
  const ChatTemplate g = ChatTemplate::load(gen.path);
  CHECK(g.has_generation_blocks());
  c.prompt_messages = 0;
  CHECK(counted(g.render_for_training(c, true)) == std::vector<std::string>{"a1;", "a2;"});

  // A template that moves the system prompt into the last user message (as Mistral's do): the
  // prefixes are not prefixes; each turn is its content and end-of-turn marker, found in order.
  TemplateFolder moved(
      "{% set sys = messages[0].content if messages[0].role == 'system' else '' %}"
      "{% set ns = namespace(last=0) %}{% for m in messages %}{% if m.role == 'user' %}"
      "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}<s>{% for m in messages %}"
      "{% if m.role == 'user' %}[INST]{% if loop.index0 == ns.last and sys %}{{ sys }} {% endif %}"
      "{{ m.content }}[/INST]{% elif m.role == 'assistant' %}{{ m.content }}</s>{% endif %}{% endfor %}");
  const ChatTemplate mv = ChatTemplate::load(moved.path);
  Conversation s = chat::read_conversation(Json::parse(
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
                       {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"},
                       {"role": "assistant", "content": "a2"}]})"));
  const ChatTemplate::Training tr = mv.render_for_training(s, true);
  CHECK(tr.text == "<s>[INST]q1[/INST]a1</s>[INST]S q2[/INST]a2</s>");
  CHECK(counted(tr) == std::vector<std::string>{"a1</s>", "a2</s>"});

  // A template that writes EOS after the last turn only (as Phi-3's, Phi-3.5's do): an earlier turn
  // is its content and as much of the last turn's ending as follows it.
  TemplateFolder phi3(
      "{% for m in messages %}{% if m.role == 'user' %}{{ '<|user|>\n' + m.content + '<|end|>\n' }}"
      "{% elif m.role == 'assistant' %}{{ '<|assistant|>\n' + m.content + '<|end|>\n' }}{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}");
  const ChatTemplate::Training ph = ChatTemplate::load(phi3.path).render_for_training(c, true);
  CHECK(ph.text ==
        "<|user|>\nq1<|end|>\n<|assistant|>\na1<|end|>\n<|user|>\nq2<|end|>\n<|assistant|>\na2<|end|>\n</s>");
  CHECK(counted(ph) == std::vector<std::string>{"a1<|end|>\n", "a2<|end|>\n</s>"});
  CHECK(ph.rule == "content search");
  CHECK(t.render_for_training(c, true).rule == "prefixes");
  CHECK(g.render_for_training(c, true).rule == "generation blocks");

  // A turn that cannot be found is refused, naming the ways on.
  TemplateFolder hides("{% for m in messages %}{% if loop.last %}{{ m.content }}{% endif %}{% endfor %}");
  CHECK_THROWS_WITH_AS(ChatTemplate::load(hides.path).render_for_training(c, true),
                       doctest::Contains("give a template with {% generation %} blocks"), InputError);
}

TEST_CASE("a folder without a template, and the template's raise_exception") {
  char name[] = "/tmp/fsdp_chat_XXXXXX";
  const std::string empty = ::mkdtemp(name);
  CHECK_THROWS_WITH_AS(ChatTemplate::load(empty), doctest::Contains("has no chat template"), InputError);
  (void)!std::system(("rm -rf " + empty).c_str());
  TemplateFolder strict("{{ raise_exception('roles must alternate') }}");
  CHECK_THROWS_AS(ChatTemplate::load(strict.path).render(Conversation{}, false), chat::TemplateRaise);
}

TEST_CASE("spans to tokens, as transformers: the token of the first character through the token of the last") {
  // "ab€c": tokens "a", "b", "€" split in two byte tokens, "c".
  const std::string text =
      "ab\xE2\x82\xAC"
      "c";
  const std::vector<std::pair<size_t, size_t>> offsets = {{0, 1}, {1, 2}, {2, 4}, {4, 5}, {5, 6}};
  CHECK(data::counted_tokens(text, offsets, {{1, 5}}) ==
        std::vector<uint8_t>{0, 1, 1, 0, 0});  // ends in "€": its first token
  CHECK(data::counted_tokens(text, offsets, {{2, 6}}) == std::vector<uint8_t>{0, 0, 1, 1, 1});
  // A span whose first character no token holds ends the marking (later spans too).
  const std::vector<std::pair<size_t, size_t>> gap = {{0, 1}, {2, 5}, {5, 6}};
  CHECK(data::counted_tokens(text, gap, {{1, 2}, {5, 6}}) == std::vector<uint8_t>{0, 0, 0});
}

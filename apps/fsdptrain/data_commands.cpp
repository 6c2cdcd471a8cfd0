// `fsdptrain tokenize`: text and JSONL into llm.c token shards with a model's tokenizer (lib/tokenize).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "chat/jinja_unicode.h"
#include "commands.h"
#include "data/corpus.h"
#include "data/documents.h"
#include "tokenize/eos.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hub_cache.h"
#include "util/strings.h"

namespace fsdp::cli {

namespace {

// "100M" tokens -> 100000000 (K, M, G, T are powers of 1000).
int64_t parse_token_count(std::string text) {
  if (!text.empty() && std::string("kKmMgGtT").find(text.back()) != std::string::npos) text += "B";
  return parse_byte_size(text, "--shard_size");
}

class TokenizeCommand final : public Command {
 public:
  CLI::App* add(CLI::App& parent) override {
    CLI::App* app = parent.add_subcommand(
        "tokenize",
        "Turn text, JSONL and Parquet files into llm.c token shards with a model's tokenizer (for data.path)");
    app->add_option("--tokenizer", tokenizer_,
                    "A Hugging Face model folder or its tokenizer.json, or a model's Hub id in the Hugging Face cache")
        ->required();
    app->add_option("--input", options_.inputs,
                    "Text, .jsonl or .json files (.gz and .zst too), .parquet or .arrow files, folders datasets' "
                    "save_to_disk wrote, or globs (repeatable; in order). Prompt/completion or conversation records "
                    "also write loss masks")
        ->expected(1, -1);
    app->add_option("--dataset", dataset_,
                    "A dataset's Hub id (ORG/NAME) in the Hugging Face cache, read after the inputs (as data.dataset)");
    app->add_option("--split", options_.split,
                    "Of --dataset or a save_to_disk folder of several splits (default train)");
    app->add_option("--config", config_, "Of --dataset: its subset (default: its only or \"default\" one)");
    app->add_option("--revision", revision_, "Of --dataset: a branch, tag or commit in the cache (default main)");
    app->add_option("--output", options_.output, "The folder of shards to create (must not exist)")->required();
    app->add_option("--field", options_.field, "The JSONL field holding each document (default text)");
    app->add_option("--shard_size,--shard-size", shard_size_, "Tokens per shard, such as 100M (default)");
    app->add_option("--jobs", options_.jobs, "Encoding threads (default: every core)");
    app->add_option("--eos", eos_, "The end-of-document token (default: the tokenizer's eos_token)");
    app->add_option("--chat_template,--chat-template", options_.chat.template_file,
                    "Conversation records: a Jinja chat template file instead of the tokenizer folder's");
    app->add_flag("--all_tokens,--all-tokens", all_tokens_,
                  "Conversation records: the loss counts every token, not only the assistant's turns");
    return app;
  }
  int run() override {
    FSDP_CHECK(!options_.inputs.empty() || !dataset_.empty(),
               "[tokenize] nothing to tokenize: give --input files (or globs), or --dataset ORG/NAME");
    if (!dataset_.empty()) {
      FSDP_CHECK(hub::is_revision(revision_), "[tokenize] --revision ", hub::bad_revision(revision_));
      const hub::DatasetFiles found = hub::dataset_files(dataset_, config_, options_.split, revision_);
      FSDP_CHECK(found.error.empty(), "[tokenize] --dataset: ", found.error);
      options_.inputs.insert(options_.inputs.end(), found.files.begin(), found.files.end());
    }
    tokenizer_ = hub::model_folder(tokenizer_);
    options_.shard_tokens = parse_token_count(shard_size_);
    options_.tokenizer_path = tokenizer_;
    options_.chat.assistant_only = !all_tokens_;
    const tokenize::Tokenizer tok = tokenize::Tokenizer::load(tokenizer_);
    const int32_t eos = tokenize::eos_id(tokenizer_, tok, eos_);
    const bool live = ::isatty(STDERR_FILENO);
    const data::CorpusSummary s =
        data::tokenize_corpus(tok, eos, options_, [live](int64_t done, int64_t total, int64_t docs, int64_t tokens) {
          if (!live) return;
          const int pct = total > 0 ? static_cast<int>(100 * done / total) : 100;
          std::fprintf(stderr, "\r[%-20s] %3d%% %s of %s | %lld documents | %s tokens",
                       std::string(pct / 5, '#').c_str(), pct, format_bytes(done).c_str(), format_bytes(total).c_str(),
                       static_cast<long long>(docs), format_count(static_cast<double>(tokens)).c_str());
        });
    if (live) std::fprintf(stderr, "\n");
    std::cout << "tokenized " << plural(s.documents, "document") << " (" << format_bytes(s.bytes) << ") into "
              << s.tokens << " tokens in " << plural(s.shards, "shard") << " of uint" << 8 * s.token_bytes << " ("
              << options_.output << "), " << format_count(static_cast<double>(s.tokens) / std::max(s.seconds, 1e-9))
              << " tokens/s; train on it with data.path: " << options_.output << "/*.bin\n";
    if (s.pairs > 0)
      std::cout << s.pairs << " prompt/completion pairs: the loss counts " << s.counted_tokens << " of the tokens ("
                << "completions and EOS; masks in shard_*.mask); the longest prompt is " << s.longest_prompt.tokens
                << " tokens (" << s.longest_prompt.file << ":" << s.longest_prompt.line
                << "), so train.sequence_length must be above it\n";
    if (s.conversations > 0)
      std::cout << plural(s.conversations, "conversation") << " rendered with the chat template: the loss counts "
                << s.counted_tokens << " of the tokens (" << (all_tokens_ ? "all" : "the assistant's turns")
                << "; masks in shard_*.mask)\n";
    return 0;
  }

 private:
  std::string tokenizer_, eos_, shard_size_ = "100M", dataset_, config_, revision_ = "main";
  bool all_tokens_ = false;
  data::CorpusOptions options_;
};

// `fsdptrain chat-template`: what a conversation trains on, as text with the spans the loss counts.
class ChatTemplateCommand final : public Command {
 public:
  CLI::App* add(CLI::App& parent) override {
    CLI::App* app = parent.add_subcommand(
        "chat-template",
        "Render conversation records with a model's chat template: one JSON object per record with "
        "\"text\" and \"assistant_spans\" (the character spans the loss counts)");
    app->add_option("FILE", input_,
                    "A .jsonl (or .parquet) of conversation records (messages, ShareGPT, or prompt/completion lists)")
        ->required();
    app->add_option("--tokenizer", folder_, "The model or tokenizer folder holding the template")->required();
    app->add_option("--chat_template,--chat-template", template_file_, "A Jinja template file instead");
    app->add_flag("--add-generation-prompt,--add_generation_prompt", generation_prompt_,
                  "Render with add_generation_prompt (the prompt of a reply)");
    app->add_flag("--all_tokens,--all-tokens", all_tokens_, "Count every character, not only the assistant's turns");
    return app;
  }
  int run() override {
    const std::string folder = is_directory(folder_) ? folder_ : parent_folder(folder_);
    const chat::ChatTemplate t = chat::ChatTemplate::load(folder, template_file_);
    data::DocumentReader reader(input_, "text", "[chat-template]", "a conversation record");
    for (auto docs = reader.next(size_t{1} << 20); !docs.empty(); docs = reader.next(size_t{1} << 20))
      for (const data::Document& d : docs) {
        const std::string where = str(input_, ":", d.line);
        FSDP_CHECK(d.chat, "[chat-template] ", where,
                   ": not a conversation record (messages, conversations, or "
                   "prompt and completion as lists of messages)");
        std::cout << render(t, d.text, where).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      }
    return 0;
  }

 private:
  nlohmann::json render(const chat::ChatTemplate& t, const std::string& record, const std::string& where) const {
    chat::ChatTemplate::Training r;
    std::string text;
    try {
      const chat::Conversation c = chat::read_conversation(chat::Json::parse(record), !generation_prompt_);
      r = t.render_for_training(c, !all_tokens_);
      text = generation_prompt_ ? t.render(c, true) : r.text;
    } catch (const chat::TemplateRaise& e) {
      throw InputError(
          str("[chat-template] ", where, ": the template (", e.where(), ":", e.line(), ") raised: ", e.what()));
    } catch (const InputError& e) {
      throw InputError(str("[chat-template] ", where, ": ", e.what()));
    }
    // Spans in characters (code points), as transformers counts them.
    auto chars = [&](size_t byte) { return chat::jinja::utf8_length(std::string_view(text).substr(0, byte)); };
    nlohmann::json spans = nlohmann::json::array();
    if (text.compare(0, r.text.size(), r.text) == 0)
      for (const auto& [b, e] : r.counted) spans.push_back({chars(b), chars(e)});
    return {{"text", text}, {"assistant_spans", spans}, {"rule", r.rule}};
  }
  std::string input_, folder_, template_file_;
  bool generation_prompt_ = false, all_tokens_ = false;
};

}  // namespace

std::unique_ptr<Command> make_tokenize_command() {
  return std::make_unique<TokenizeCommand>();
}
std::unique_ptr<Command> make_chat_template_command() {
  return std::make_unique<ChatTemplateCommand>();
}

}  // namespace fsdp::cli

// `fsdptrain tokenize`: text and JSONL into llm.c token shards with a model's tokenizer (lib/tokenize).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "data/corpus.h"
#include "tokenize/eos.h"
#include "util/error.h"
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
        "tokenize", "Turn text and JSONL files into llm.c token shards with a model's tokenizer (for data.path)");
    app->add_option("--tokenizer", tokenizer_, "A Hugging Face model folder or its tokenizer.json")->required();
    app->add_option("--input", options_.inputs,
                    "Text or .jsonl files (.gz and .zst too), or globs (repeatable; in order). JSONL of "
                    "prompt/completion records also writes loss masks")
        ->required()
        ->expected(1, -1);
    app->add_option("--output", options_.output, "The folder of shards to create (must not exist)")->required();
    app->add_option("--field", options_.field, "The JSONL field holding each document (default text)");
    app->add_option("--shard_size,--shard-size", shard_size_, "Tokens per shard, such as 100M (default)");
    app->add_option("--jobs", options_.jobs, "Encoding threads (default: every core)");
    app->add_option("--eos", eos_, "The end-of-document token (default: the tokenizer's eos_token)");
    return app;
  }
  int run() override {
    options_.shard_tokens = parse_token_count(shard_size_);
    options_.tokenizer_path = tokenizer_;
    const tokenize::Tokenizer tok = tokenize::Tokenizer::load(tokenizer_);
    const int32_t eos = tokenize::eos_id(tokenizer_, tok, eos_);
    const bool live = ::isatty(STDERR_FILENO);
    const data::CorpusSummary s =
        data::tokenize_corpus(tok, eos, options_, [live](int64_t done, int64_t total, int64_t docs, int64_t tokens) {
          if (!live) return;
          const int pct = total > 0 ? static_cast<int>(100 * done / total) : 100;
          std::fprintf(stderr, "\r[%-20s] %3d%% %s of %s | %lld documents | %s tokens", std::string(pct / 5, '#').c_str(),
                       pct, format_bytes(done).c_str(), format_bytes(total).c_str(), static_cast<long long>(docs),
                       format_count(static_cast<double>(tokens)).c_str());
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
    return 0;
  }

 private:
  std::string tokenizer_, eos_, shard_size_ = "100M";
  data::CorpusOptions options_;
};

}  // namespace

std::unique_ptr<Command> make_tokenize_command() { return std::make_unique<TokenizeCommand>(); }

}  // namespace fsdp::cli

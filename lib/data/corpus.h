// `fsdptrain tokenize`: text and JSONL documents into llm.c token shards with a model's tokenizer.
//
// Documents (data/documents.h) are read in input order (globs sorted), encoded on `jobs`
// threads a batch at a time, and written in the same order: each document's ids (with the
// tokenizer's template, e.g. BOS) followed by the EOS id. A prompt/completion record is the
// prompt's ids (with the template) then the completion's (without), then EOS: encoded apart, so
// the boundary never merges. Shards hold up to `shard_tokens` tokens each, uint16 when the
// vocabulary fits, else uint32.
//
// A conversation record is rendered with the model's chat template and tokenized as a whole
// (data/chat_records.h), without an EOS (the template ends each turn).
//
// When any input holds prompt/completion or conversation records, each shard_N.bin gets a
// shard_N.mask beside it (data/token_shard.h: a byte per token, 0 for a prompt's tokens or a
// conversation's tokens the loss does not count). tokenize.json records what was made (documents,
// tokens, the longest prompt and where it is, the tokenizer and EOS).
//
// Everything is written into <output>.partial and renamed to <output> at the end, so a cut-off run
// leaves nothing that looks complete; a failed one leaves nothing at all.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "data/chat_records.h"
#include "tokenize/tokenizer.h"

namespace fsdp::data {

struct CorpusOptions {
  std::vector<std::string> inputs;     // files or globs: *.jsonl[.gz|.zst] (JSON per line), else text
  std::string output;                  // the folder to create (must not exist)
  std::string field = "text";          // JSONL: the field holding each document
  std::string split = "train";         // the split of a save_to_disk DatasetDict folder among the inputs
  std::string field_hint = "--field";  // how the user names another field (errors say it)
  std::string who = "[tokenize]";      // starts error messages
  std::string tokenizer_path;          // recorded in tokenize.json
  int64_t shard_tokens = 100000000;
  int jobs = 0;  // encoding threads; 0: the cores this process may use
  // Conversation records (data/chat_records.h): the template's folder ("": the tokenizer's), a
  // template file instead, and what the loss counts.
  ChatOptions chat;
};

// The longest prompt of the prompt/completion records, in tokens (its template's too), and where.
struct LongestPrompt {
  int64_t tokens = 0;
  std::string file;
  int64_t line = 0;
};

struct CorpusSummary {
  int64_t documents = 0, tokens = 0, shards = 0, bytes = 0;
  int64_t pairs = 0;           // prompt/completion records among the documents
  int64_t conversations = 0;   // conversation records among them
  int64_t counted_tokens = 0;  // tokens the loss counts as targets (all but prompts')
  LongestPrompt longest_prompt;
  double seconds = 0;
  int token_bytes = 2;                        // 2: uint16 shards, 4: uint32
  std::map<std::string, uint32_t> checksums;  // every shard and mask file -> CRC-32C (data/token_shard.h)
  int mask_format = 1;                        // 2: masks mark where records start
};

// Called after each batch: bytes of input read so far, of `total`.
using CorpusProgress = std::function<void(int64_t done, int64_t total, int64_t documents, int64_t tokens)>;

// Throws InputError naming the file (and line) for: no input matched, an existing output folder, a
// JSONL line that is not an object with a string `field` (or a pair, in a file of pairs), a file
// compressed other than with gzip or zstd.
CorpusSummary tokenize_corpus(const tokenize::Tokenizer& tokenizer, int32_t eos, const CorpusOptions& options,
                              const CorpusProgress& progress = {});

// What tokenize.json in a folder of shards says (all zero when there is none).
CorpusSummary read_corpus_summary(const std::string& folder);

}  // namespace fsdp::data

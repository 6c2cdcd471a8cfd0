// `fsdptrain tokenize`: text and JSONL documents into llm.c token shards with a model's tokenizer.
//
// Documents are read in input order (globs sorted), encoded on `jobs` threads a batch at a time,
// and written in the same order: each document's ids (with the tokenizer's template, e.g. BOS)
// followed by the EOS id. Shards hold up to `shard_tokens` tokens each, uint16 when the vocabulary
// fits, else uint32. Everything is written into <output>.partial and renamed to <output> at the
// end, so a cut-off run leaves nothing that looks complete; a failed one leaves nothing at all.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tokenize/tokenizer.h"

namespace fsdp::tokenize {

struct CorpusOptions {
  std::vector<std::string> inputs;  // files or globs: *.jsonl (one JSON object per line), else text
  std::string output;               // the folder to create (must not exist)
  std::string field = "text";       // JSONL: the field holding each document
  int64_t shard_tokens = 100000000;
  int jobs = 0;  // encoding threads; 0: the cores this process may use
};

struct CorpusSummary {
  int64_t documents = 0, tokens = 0, shards = 0, bytes = 0;
  double seconds = 0;
  int token_bytes = 2;  // 2: uint16 shards, 4: uint32
};

// Called after each batch: bytes of input read so far, of `total`.
using CorpusProgress = std::function<void(int64_t done, int64_t total, int64_t documents, int64_t tokens)>;

// Throws InputError naming the file (and line) for: no input matched, an existing output folder, a
// JSONL line that is not an object with a string `field`, a compressed input.
CorpusSummary tokenize_corpus(const Tokenizer& tokenizer, int32_t eos, const CorpusOptions& options,
                              const CorpusProgress& progress = {});

// The EOS id of the tokenizer at `path` (a model folder or a tokenizer.json): `eos_token` of the
// tokenizer_config.json beside it, else `eos_token_id` of config.json. `override_token` wins when
// given. Throws InputError saying where it looked.
int32_t eos_id(const std::string& path, const Tokenizer& tokenizer, const std::string& override_token = "");

}  // namespace fsdp::tokenize

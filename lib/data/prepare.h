// How data.path becomes token ids, before training reads it (dataset.h):
//   - llm.c shards (*.bin): read as they are.
//   - text and JSONL with a tokenizer (data.tokenizer, else model.pretrained's tokenizer.json):
//     tokenized once into llm.c shards (data/corpus.h; loss masks for prompt/completion
//     records) in data.cache_dir/<key>, and read from there. The key hashes the tokenizer files, the
//     EOS id, data.field and every input's content, so a cache is never stale; a stamp of the
//     inputs' paths, sizes and modification times (data.cache_dir/stamps/) finds it again without
//     reading the inputs, so a second launch on unchanged data starts at once.
//   - text and JSONL without a tokenizer, for a byte-level model (vocab_size 257): bytes.
// Safe to call from several processes at once (each machine's launcher, each worker): each writes
// its own temporary folder and renames it; one that finds the cache already made uses it.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "chat/jinja.h"

namespace fsdp::data {

struct DataOptions {
  std::string path;                      // data.path: files, a glob, or a folder datasets' save_to_disk wrote
  std::string dataset;                   // data.dataset: a Hub id in the Hugging Face cache, instead of path
  std::string split = "train";           // data.split (of dataset, or of a save_to_disk DatasetDict)
  std::string config;                    // data.config (of dataset)
  std::string revision = "main";         // data.revision (of dataset)
  std::string field;                     // data.field: JSONL documents' field
  std::string tokenizer;                 // data.tokenizer: a tokenizer.json or a folder holding one ("" unset)
  std::string pretrained;                // model.pretrained ("" unset)
  std::string cache_dir;                 // data.cache_dir
  int64_t vocab_size = 0;                // the model's
  std::string chat_template;             // data.chat_template
  bool assistant_only_loss = true;       // data.assistant_only_loss
  chat::TemplateLimits template_limits;  // data.chat_template_max_*
  // Asked between batches while tokenizing: true stops it (Ctrl-C), with an Error saying how far it
  // got; nothing partial is kept.
  std::function<bool()> interrupted;
};

enum class DataKind { kShards, kBytes, kTokenize };

struct DataPlan {
  DataKind kind = DataKind::kShards;
  std::string tokenizer;          // kTokenize: the tokenizer.json used
  std::string path;               // what read_tokens reads: data.path, or the cached shards' glob
  std::string note;               // a line saying what was done (for the log), "" for nothing to say
  int64_t longest_prompt = 0;     // kTokenize: of the prompt/completion records, in tokens
  std::string longest_prompt_at;  // and where it is, "file:line"
};

// The files data.path or data.dataset names, in order: a glob's matches, the Arrow files of a
// save_to_disk folder, a cached Hub dataset's files of data.split. Throws InputError for a folder
// or dataset that holds none (saying what it holds instead); an unmatched glob is empty.
std::vector<std::string> input_files(const DataOptions& options);
// "data.path X", or "the dataset ORG/NAME (split S)", for messages.
std::string input_name(const DataOptions& options);

// Which of the three data.path is, and for kTokenize the tokenizer; makes nothing. Throws
// InputError naming the key to set for text that the model needs a tokenizer for, shards mixed
// with text, a missing tokenizer file.
DataPlan plan_data(const DataOptions& options);

// plan_data, and for kTokenize the cached shards, made when missing. `progress`, when given, gets
// a live progress line (\r) while tokenizing (a terminal).
DataPlan prepare_data(const DataOptions& options, std::ostream* progress = nullptr);

// A 64-bit hash of bytes (not cryptographic; cache keys).
uint64_t hash_bytes(const void* data, size_t n, uint64_t seed = 0);

}  // namespace fsdp::data

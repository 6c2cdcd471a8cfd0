// Training data: a stream of token ids, read from llm.c token shards or from raw text through a
// built-in byte-level tokenizer, and a distributed loader over it.
//
// Inputs (data.path; a file, or a glob such as "data/fineweb_train_*.bin", in sorted order):
//   *.bin    llm.c token shards (data/token_shard.h), with their loss masks when there are any.
//   *.jsonl  one JSON object per line (data/documents.h): a "text" field (data.field), or a
//            prompt/completion pair; .gz and .zst too.
//   other    a text file; the whole file is a document.
// read_tokens reads text as bytes (ids 0..255), for byte-level models; data/prepare.h turns text
// into shards with a real tokenizer first. Each byte-level document is preceded by the end-of-text
// id 256, as llm.c's shards precede each document with EOT, so a byte-level model needs
// vocab_size >= 257. A pair is EOT, the prompt's bytes (not targets), the completion's (targets).
//
// llm.c shards are read in place with pread, a window at a time, so a worker's memory does not grow
// with the dataset (neither the file nor the page cache counts toward it); each is scanned once when
// opened (ids of 2^31 or more are refused, the largest id is kept). Text and JSONL are tokenized
// into memory.
//
// Threads: a TokenStream's const methods may run on several threads at once (reads are pread with
// thread-local buffers). A DistributedLoader is used by one thread at a time; the trainer hands it
// to its read-ahead thread and does not touch it until that thread's batches are taken.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::data {

inline constexpr int32_t kByteEndOfText = 256;
inline constexpr int64_t kByteVocabSize = 257;
inline constexpr int64_t kIgnoreTarget = -100;  // the loss's ignore_index (model/layers/chunked_loss.h)

class TokenStream {
 public:
  TokenStream() = default;
  // Tokens already in memory (tests, tools), as one source named `name`.
  // `mask`, when given: a byte per token, 0 when the token is not a target (a prompt's).
  static TokenStream in_memory(std::vector<int32_t> tokens, const std::string& name = "(memory)",
                               std::vector<uint8_t> mask = {});

  int64_t size() const { return size_; }
  // Copies tokens [begin, begin + n) into `out`, across file boundaries.
  void read(int64_t begin, int64_t n, int64_t* out) const;
  std::vector<int32_t> read_all() const;  // every token (small streams: tests)
  const std::vector<std::string>& files() const { return files_; }
  std::vector<int64_t> file_ends() const;  // tokens [ends[k-1], ends[k]) came from files()[k]
  int64_t max_token() const;
  // Whether some tokens are not targets (prompt/completion data); then read_mask says which.
  bool has_mask() const;
  // Mask bytes (data/token_shard.h): kMaskTarget for a target, kMaskRecordStart on a record's first.
  void read_mask(int64_t begin, int64_t n, uint8_t* out) const;
  // Whether every source marks where its records start (prompt/completion and chat data), and
  // where they do (token offsets, ascending; reads the whole mask).
  bool has_records() const;
  std::vector<int64_t> record_starts() const;
  // The longest prompt in tokens and where it is ("file:line"); 0 and "" without prompts.
  int64_t longest_prompt() const { return longest_prompt_; }
  const std::string& longest_prompt_at() const { return longest_prompt_at_; }
  // Throws InputError naming the prompt when one does not leave a target in a sequence of seq_len.
  void check_prompts_fit(int64_t seq_len) const;
  // Throws InputError naming the file and position of the first id >= vocab_size, and `fix`.
  void check_below(int64_t vocab_size, const std::string& fix) const;

  struct Source;  // one file: an open shard, or tokens in memory

 private:
  friend TokenStream read_tokens(const std::string& path_or_glob, const std::string& field);
  void add(std::shared_ptr<const Source> source, const std::string& file);
  void note_prompt(int64_t tokens, const std::string& where);
  std::vector<std::shared_ptr<const Source>> sources_;
  std::vector<std::string> files_;
  std::vector<int64_t> starts_;  // each source's first token
  int64_t size_ = 0;
  int64_t longest_prompt_ = 0;
  std::string longest_prompt_at_;
};

// Reads data.path (text as bytes). Throws InputError naming the file for: no match, a folder, an
// empty file, a wrong magic or size, a mask of another size, an id of 2^31 or more, a JSONL line
// without a string `field` (or a pair, in a file of pairs).
TokenStream read_tokens(const std::string& path_or_glob, const std::string& field = "text");

// Throws InputError naming the prompt at `where` ("file:line") when `tokens` of it leave no target in
// a sequence of seq_len.
void check_prompt_fits(int64_t tokens, const std::string& where, int64_t seq_len);


// The sequence windows of a stream: sequence i is tokens [i*T, i*T + T + 1) (inputs are the first
// T, targets the last T). The last `eval_sequences` windows are held out for evaluation.
struct Split {
  int64_t train_sequences = 0;
  int64_t eval_sequences = 0;
};
// The last eval_fraction of `sequences` held out (at least one when eval_fraction > 0). Throws
// InputError naming `what` when there is none, or none left to train on.
Split split_sequences(int64_t sequences, double eval_fraction, const std::string& what);

// How records fill sequences (data.packing).
//   kPlain   windows of seq_len tokens cut from the stream, one causal mask across whatever they hold
//            (text, as llm.c and nanoGPT train).
//   kMasked  the same windows, but each token attends only to the tokens of its own record, its
//            position restarts at its record's first token (or at the window's start for a record
//            that began in the window before), and the target that would predict the next record's
//            first token is ignored: TRL's padding-free packing, TorchTitan's document masking.
//   kPad     one record per sequence, cut to seq_len + 1 tokens, padded with ignored targets.
enum class Packing { kPlain, kMasked, kPad };

// (B, T) inputs and (B, T) targets, int64; a target that is not counted (a prompt's token, padding,
// a record boundary under kMasked) is kIgnoreTarget. With kMasked, also each input's position in
// its record and its record's index within its row (B, T each); empty otherwise.
struct Batch {
  std::vector<int64_t> inputs, targets;
  std::vector<int64_t> positions, segments;
  int64_t counted_targets() const;  // the targets that are not kIgnoreTarget
};

// The sequences of a stream under a packing: windows, or records (kPad, which reads the stream's
// record starts once). Read-only after construction: several threads may append rows at once.
class SequenceReader {
 public:
  // Throws InputError when kMasked or kPad is asked of a stream that does not mark its records.
  SequenceReader(const TokenStream& stream, int64_t seq_len, Packing packing, const std::string& what);
  int64_t count() const { return count_; }  // sequences: windows of seq_len + 1 tokens, or records
  Packing packing() const { return packing_; }
  int64_t truncated() const { return truncated_; }  // kPad: records longer than a sequence
  // Appends sequence `k` as one row of `out`.
  void append(int64_t k, Batch& out) const;

 private:
  void append_window(int64_t k, Batch& out) const;
  void append_record(int64_t k, Batch& out) const;
  const TokenStream& stream_;
  int64_t seq_len_;
  Packing packing_;
  std::vector<int64_t> records_;  // kPad: each record's first token
  int64_t count_ = 0, truncated_ = 0;
};

// Each rank reads disjoint sequences: a step of the whole job takes world_size * batch sequences
// from a seeded permutation of the sequences [first_sequence, first_sequence + num_sequences), rank
// r the r-th block of `batch` of them. The order depends only on the seed (not on the world size),
// so W ranks with batch B read the same sequences per step as one rank with batch W * B. A new
// permutation starts each epoch: Fisher-Yates (i from n-1 down to 1, swap i with next() % (i + 1))
// over SplitMix64 seeded with seed * 1000003 + epoch, portable so other tools can read the same order.
class DistributedLoader {
 public:
  DistributedLoader(const SequenceReader& reader, int64_t first_sequence, int64_t num_sequences, int64_t batch,
                    int rank, int world_size, uint64_t seed);
  using Batch = data::Batch;
  Batch next();

  struct Position {  // what a checkpoint saves to resume the data exactly
    int64_t epoch = 0;
    int64_t offset = 0;  // sequences of the permutation already consumed by the whole job
  };
  Position position() const { return {epoch_, offset_}; }
  void set_position(const Position& p);
  int64_t batch() const { return batch_; }

 private:
  void shuffle();
  const SequenceReader& reader_;
  int64_t first_, count_, batch_;
  int rank_, world_;
  uint64_t seed_;
  int64_t epoch_ = 0, offset_ = 0;
  std::vector<uint32_t> order_;  // 4 bytes a sequence: the one part of memory that grows with the data
};

}  // namespace fsdp::data

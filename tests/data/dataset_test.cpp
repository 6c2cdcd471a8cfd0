// Token inputs and the distributed loader: formats, errors, disjoint and deterministic reads across
// world sizes, and an exact resume position.
#include "data/dataset.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <numeric>
#include <set>

#include "data/token_shard.h"
#include "support/error_of.h"
#include "util/error.h"
#include "util/files.h"

using namespace fsdp::data;

namespace {

using fsdp::testing::error_of;

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/fsdp_data_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { (void)!std::system(("rm -rf " + path).c_str()); }
  std::string file(const std::string& name, const std::string& content) const {
    std::ofstream(path + "/" + name, std::ios::binary) << content;
    return path + "/" + name;
  }
};

TokenStream counting(int32_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::iota(tokens.begin(), tokens.end(), 0);
  return TokenStream::in_memory(std::move(tokens), "counting");
}

// The first token of every sequence a rank reads in `steps` steps.
std::vector<int64_t> firsts(DistributedLoader& l, int steps) {
  std::vector<int64_t> out;
  for (int s = 0; s < steps; ++s) {
    const auto b = l.next();
    const size_t T = b.inputs.size() / static_cast<size_t>(l.batch());
    for (int64_t i = 0; i < l.batch(); ++i) out.push_back(b.inputs[i * T]);
  }
  return out;
}

// Windows of seq_len tokens (data.packing: plain).
SequenceReader windows(const TokenStream& s, int64_t seq_len) {
  return SequenceReader(s, seq_len, Packing::kPlain, s.files().empty() ? "stream" : s.files()[0]);
}

}  // namespace

TEST_CASE("llm.c shards round-trip in both token widths, a glob reads files in order") {
  TempDir d;
  write_shard(d.path + "/a_000.bin", {1, 2, 3, 50256});
  write_shard(d.path + "/a_001.bin", {128000, 7});
  const TokenStream s = read_tokens(d.path + "/a_*.bin");
  CHECK(s.read_all() == std::vector<int32_t>{1, 2, 3, 50256, 128000, 7});
  CHECK(s.files().size() == 2);
  // A window across the two files, read in place.
  std::vector<int64_t> w(3);
  s.read(3, 3, w.data());
  CHECK(w == std::vector<int64_t>{50256, 128000, 7});
  std::ifstream f(d.path + "/a_001.bin", std::ios::binary);
  int32_t header[3];
  f.read(reinterpret_cast<char*>(header), sizeof(header));
  CHECK(header[0] == 20240801);  // 128000 needs uint32
  CHECK(header[2] == 2);
}

TEST_CASE("text and JSONL go through the byte tokenizer, each document after an end-of-text id") {
  TempDir d;
  CHECK(read_tokens(d.file("a.txt", "hi")).read_all() == std::vector<int32_t>{kByteEndOfText, 'h', 'i'});
  const auto j = read_tokens(d.file("b.jsonl", "{\"text\": \"ab\"}\n\n{\"text\": \"\\u00e9\"}\n")).read_all();
  CHECK(j == std::vector<int32_t>{kByteEndOfText, 'a', 'b', kByteEndOfText, 0xC3, 0xA9});
}

// A new user's first day: a .json array of the same records became "1 file, 1 document" of raw JSON,
// and a .parquet file was read as text. A .json file is read by what it holds (an array, or JSON
// Lines as datasets' to_json writes them), a .parquet file as a table, and what is not text is
// refused by name.
TEST_CASE("a .json array or JSON Lines reads as its records; other tables and binary files are refused by name") {
  TempDir d;
  const std::string records = "{\"text\": \"ab\"}\n{\"text\": \"\\u00e9\"}\n";
  const auto jsonl = read_tokens(d.file("r.jsonl", records)).read_all();
  CHECK(jsonl == std::vector<int32_t>{kByteEndOfText, 'a', 'b', kByteEndOfText, 0xC3, 0xA9});
  CHECK(read_tokens(d.file("array.json", " [{\"text\": \"ab\"},\n {\"text\": \"\\u00e9\"}]\n")).read_all() == jsonl);
  CHECK(read_tokens(d.file("lines.json", records)).read_all() == jsonl);
  CHECK(error_of([&] { read_tokens(d.file("obj.json", "[1, 2")); }).find("obj.json") != std::string::npos);
  const std::string table = error_of([&] { read_tokens(d.file("train.csv", "text\nab\n")); });
  CHECK(table.find("train.csv is a csv file, which would be read as plain text") != std::string::npos);
  CHECK(table.find("JSON Lines (.jsonl)") != std::string::npos);
  CHECK(table.find("Parquet (.parquet)") != std::string::npos);
  // A .parquet file is read as a table (tests/data/hub_parquet_test.py): one that is not is named.
  CHECK(error_of([&] { read_tokens(d.file("train.parquet", "PAR1....")); })
            .find("train.parquet is not a readable Parquet file") != std::string::npos);
  CHECK(error_of([&] { read_tokens(d.file("data.txt", "PAR1\x15\x04")); }).find("a Parquet file, by its first bytes") !=
        std::string::npos);
  CHECK(error_of([&] { read_tokens(d.file("blob.dat", std::string("ab\0cd", 5))); }).find("holds NUL bytes") !=
        std::string::npos);
  CHECK(read_tokens(d.file("note.md", "hi")).read_all() == std::vector<int32_t>{kByteEndOfText, 'h', 'i'});
  // A number beyond double's range is named with its file and line, not as the JSON library's code.
  const std::string big = error_of([&] { read_tokens(d.file("big.jsonl", "{\"text\": \"a\"}\n{\"x\": 1e400}\n")); });
  CHECK(big.find("big.jsonl:2: number overflow parsing '1e400' (a number beyond double's range)") != std::string::npos);
  CHECK(big.find("json.exception") == std::string::npos);
  // A conversation with a misspelt or mistyped "messages" is named as such, not as a prompt/completion pair.
  const std::string typo = error_of(
      [&] { read_tokens(d.file("typo.jsonl", "{\"message\": [{\"role\": \"user\", \"content\": \"q\"}]}\n")); });
  CHECK(typo.find("typo.jsonl:1: a conversation record needs a \"messages\" list (or ShareGPT's \"conversations\"); "
                  "this one has keys message; did you mean \"messages\" for \"message\"?") != std::string::npos);
  const std::string text = error_of([&] { read_tokens(d.file("str.jsonl", "{\"messages\": \"hello\"}\n")); });
  CHECK(text.find("str.jsonl:1: a conversation record's \"messages\" is string, not a list of messages") !=
        std::string::npos);
}

// Issue 19, cases 8 and 9: an id of 2^31 or more in a uint32 shard once became a negative int32
// and failed deep in LibTorch ("index out of range in self"); a folder failed in the stream library.
TEST_CASE("a uint32 id beyond int32, an id beyond the vocabulary and a folder are named with the file and position") {
  TempDir d;
  write_shard(d.path + "/big.bin", {1, 70000, 3});  // uint32 tokens
  {
    std::fstream f(d.path + "/big.bin", std::ios::binary | std::ios::in | std::ios::out);
    const uint32_t huge = 0x80000005u;  // 2^31 + 5
    f.seekp(1024 + 4 * 2);
    f.write(reinterpret_cast<const char*>(&huge), 4);
  }
  const std::string e = error_of([&] { read_tokens(d.path + "/big.bin"); });
  CHECK(e.find(d.path + "/big.bin: token 2 (byte 1032) is id 2147483653") != std::string::npos);

  write_shard(d.path + "/s_0.bin", {1, 2, 3});
  write_shard(d.path + "/s_1.bin", {4, 5, 99, 6});
  const TokenStream s = read_tokens(d.path + "/s_*.bin");
  CHECK(s.file_ends() == std::vector<int64_t>{3, 7});
  CHECK_NOTHROW(s.check_below(100, "raise vocab_size"));
  CHECK(error_of([&] {
          s.check_below(50, "raise vocab_size");
        }).find(d.path + "/s_1.bin: token 2 is id 99 but the model's vocab_size is 50; raise vocab_size") !=
        std::string::npos);

  const std::string folder = error_of([&] { read_tokens(d.path); });
  CHECK(folder.find("data.path \"" + d.path + "\" is a folder") != std::string::npos);
  CHECK(folder.find(d.path + "/*.bin") != std::string::npos);
  // A folder of JSONL gets a JSONL glob (issue 27: it was told */*.bin).
  TempDir j;
  j.file("a.jsonl", "{\"text\": \"x\"}\n");
  CHECK(error_of([&] { read_tokens(j.path); }).find("a glob such as " + j.path + "/*.jsonl") != std::string::npos);
}

TEST_CASE("bad inputs name the file and the fix") {
  TempDir d;
  CHECK(error_of([&] { read_tokens(d.path + "/missing*.txt"); }).find("matches no file") != std::string::npos);
  CHECK(error_of([&] { read_tokens(d.file("empty.txt", "")); }).find("empty.txt is empty") != std::string::npos);
  CHECK(error_of([&] { read_tokens(d.file("bad.bin", std::string(1024, 'x'))); }).find("is not an llm.c token shard") !=
        std::string::npos);
  write_shard(d.path + "/cut.bin", {1, 2, 3});
  ::truncate((d.path + "/cut.bin").c_str(), 1024 + 4);
  CHECK(error_of([&] { read_tokens(d.path + "/cut.bin"); }).find("truncated") != std::string::npos);
  CHECK(error_of([&] { read_tokens(d.file("x.jsonl", "{\"body\": 1}\n")); })
            .find("x.jsonl:1: no string field \"text\" nor \"prompt\" and \"completion\" nor a \"messages\" or "
                  "\"conversations\" list; name the field that holds the text with data.field") != std::string::npos);
  const TokenStream tiny = counting(10);
  CHECK(error_of([&] { windows(tiny, 16); }).find("has 10 tokens, shorter than one sequence of 17") !=
        std::string::npos);
  CHECK(error_of([] {
          split_sequences(1, 0.5, "few.txt");
        }).find("few.txt: nothing left to train on after holding out 1 of 1 sequence") != std::string::npos);
  const TokenStream s = counting(100);
  const SequenceReader r = windows(s, 8);
  CHECK(error_of([&] { DistributedLoader(r, 0, 3, 2, 0, 2, 1); }).find("cannot fill one step") != std::string::npos);
  CHECK(error_of([&] {
          SequenceReader(s, 8, Packing::kMasked, "text.bin");
        }).find("data.packing: masked needs records, and text.bin marks none") != std::string::npos);
}

TEST_CASE("ranks read disjoint sequences; W ranks read what one rank with W times the batch reads") {
  const TokenStream s = counting(8 * 64 + 1);  // 64 sequences of 8 (+1)
  const SequenceReader r = windows(s, 8);
  CHECK(r.count() == 64);
  CHECK(split_sequences(r.count(), 0.0, "counting").train_sequences == 64);
  CHECK(split_sequences(r.count(), 0.1, "counting").eval_sequences == 6);
  DistributedLoader one(r, 0, 64, 8, 0, 1, 42);
  const std::vector<int64_t> all = firsts(one, 6);  // crosses an epoch (8 steps of 8 = 64)
  std::vector<int64_t> merged;
  for (int w : {2, 4}) {
    std::vector<std::vector<int64_t>> per_rank;
    for (int rank = 0; rank < w; ++rank) {
      DistributedLoader l(r, 0, 64, 8 / w, rank, w, 42);
      per_rank.push_back(firsts(l, 6));
    }
    merged.clear();
    for (int step = 0; step < 6; ++step)
      for (int rank = 0; rank < w; ++rank)
        for (int i = 0; i < 8 / w; ++i) merged.push_back(per_rank[rank][step * (8 / w) + i]);
    CHECK(merged == all);
    std::set<int64_t> first_step;
    for (int rank = 0; rank < w; ++rank)
      for (int i = 0; i < 8 / w; ++i) CHECK(first_step.insert(per_rank[rank][i]).second);
  }
  // Targets are the inputs shifted by one token.
  DistributedLoader l(r, 0, 64, 1, 0, 1, 42);
  const auto b = l.next();
  for (int t = 0; t < 8; ++t) CHECK(b.targets[t] == b.inputs[t] + 1);
  // Another seed reads another order; held-out sequences are never read for training.
  DistributedLoader other(r, 0, 64, 8, 0, 1, 43);
  CHECK(firsts(other, 1) != std::vector<int64_t>(all.begin(), all.begin() + 8));
  DistributedLoader head(r, 0, 60, 4, 0, 1, 42);
  for (int64_t f : firsts(head, 30)) CHECK(f < 60 * 8);
}

TEST_CASE("a saved position resumes the exact sequence of batches") {
  const TokenStream s = counting(8 * 40 + 1);
  const SequenceReader r = windows(s, 8);
  DistributedLoader a(r, 0, 40, 3, 1, 2, 7);
  firsts(a, 9);  // into the second epoch
  const auto pos = a.position();
  const auto expected = firsts(a, 10);
  DistributedLoader b(r, 0, 40, 3, 1, 2, 7);
  b.set_position(pos);
  CHECK(firsts(b, 10) == expected);
}

TEST_CASE("prompt/completion records: the prompt's tokens are inputs, never targets; the longest prompt is named") {
  TempDir d;
  const std::string path = d.file("pairs.jsonl",
                                  "{\"prompt\": \"ab\", \"completion\": \"c\"}\n"
                                  "{\"prompt\": \"defg\", \"completion\": \"hi\"}\n");
  const TokenStream s = read_tokens(path);
  const std::vector<int32_t> want{kByteEndOfText, 'a', 'b', 'c', kByteEndOfText, 'd', 'e', 'f', 'g', 'h', 'i'};
  REQUIRE(s.read_all() == want);
  REQUIRE(s.has_mask());
  std::vector<uint8_t> mask(want.size());
  s.read_mask(0, static_cast<int64_t>(want.size()), mask.data());
  // EOT ends the document before (a target) and starts its record.
  CHECK(mask == std::vector<uint8_t>{3, 0, 0, 1, 3, 0, 0, 0, 0, 1, 1});
  CHECK(s.has_records());
  CHECK(s.record_starts() == std::vector<int64_t>{0, 4});
  CHECK(s.longest_prompt() == 5);  // EOT + "defg"
  CHECK(s.longest_prompt_at() == path + ":2");
  CHECK_NOTHROW(s.check_prompts_fit(6));
  CHECK(error_of([&] {
          s.check_prompts_fit(5);
        }).find(path + ":2: the prompt is 5 tokens, and a sequence of train.sequence_length 5") != std::string::npos);

  // One sequence of the whole stream: every target that is a prompt's token is ignored.
  const SequenceReader r = windows(s, 10);
  DistributedLoader loader(r, 0, 1, 1, 0, 1, 7);
  const auto b = loader.next();
  CHECK(b.inputs == std::vector<int64_t>(want.begin(), want.end() - 1));
  const int64_t x = kIgnoreTarget;
  CHECK(b.targets == std::vector<int64_t>{x, x, 'c', kByteEndOfText, x, x, x, x, 'h', 'i'});
  // Pretraining text has no mask: every target counts.
  CHECK_FALSE(read_tokens(d.file("plain.jsonl", "{\"text\": \"ab\"}\n")).has_mask());

  // Masked packing: the same window, each token's position restarts at its record, the second
  // record is segment 1, and the target that crosses into it (its EOT) is not counted.
  const SequenceReader masked(s, 10, Packing::kMasked, path);
  Batch m;
  masked.append(0, m);
  CHECK(m.inputs == b.inputs);
  CHECK(m.targets == std::vector<int64_t>{x, x, 'c', x, x, x, x, x, 'h', 'i'});
  CHECK(m.positions == std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 4, 5});
  CHECK(m.segments == std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 1, 1, 1});
  CHECK(b.positions.empty());  // plain windows have none

  // Padding: one record per row, cut to seq_len + 1 tokens (the second loses its last), padded with
  // ignored targets.
  const SequenceReader pad(s, 5, Packing::kPad, path);
  CHECK(pad.count() == 2);
  CHECK(pad.truncated() == 1);
  Batch p;
  pad.append(0, p);
  pad.append(1, p);
  CHECK(p.inputs == std::vector<int64_t>{kByteEndOfText, 'a', 'b', 'c', 0, kByteEndOfText, 'd', 'e', 'f', 'g'});
  CHECK(p.targets == std::vector<int64_t>{x, x, 'c', x, x, x, x, x, x, 'h'});
  CHECK(p.counted_targets() == 2);
}

TEST_CASE("a shard's .mask is read beside it, and one of another length is refused") {
  TempDir d;
  write_shard(d.path + "/shard_000000.bin", {5, 6, 7, 8});
  d.file("shard_000000.mask", std::string("\x00\x00\x01\x01", 4));
  write_shard(d.path + "/shard_000001.bin", {9, 10});  // no mask: every token a target
  const TokenStream s = read_tokens(d.path + "/*.bin");
  REQUIRE(s.has_mask());
  std::vector<uint8_t> mask(6);
  s.read_mask(0, 6, mask.data());
  CHECK(mask == std::vector<uint8_t>{0, 0, 1, 1, 1, 1});
  d.file("shard_000001.mask", "x");
  CHECK(error_of([&] {
          read_tokens(d.path + "/*.bin");
        }).find("shard_000001.mask has 1 bytes but " + d.path + "/shard_000001.bin has 2 tokens") != std::string::npos);
}

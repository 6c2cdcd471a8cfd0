// Token inputs and the distributed loader: formats, errors, disjoint and deterministic reads across
// world sizes, and an exact resume position.
#include "data/dataset.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <numeric>
#include <set>

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
    for (int64_t i = 0; i < l.batch(); ++i) out.push_back(b.inputs[i * l.seq_len()]);
  }
  return out;
}

}  // namespace

TEST_CASE("llm.c shards round-trip in both token widths, a glob reads files in order") {
  TempDir d;
  write_llmc_shard(d.path + "/a_000.bin", {1, 2, 3, 50256});
  write_llmc_shard(d.path + "/a_001.bin", {128000, 7});
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

// Issue 19, cases 8 and 9: an id of 2^31 or more in a uint32 shard once became a negative int32
// and failed deep in LibTorch ("index out of range in self"); a folder failed in the stream library.
TEST_CASE("a uint32 id beyond int32, an id beyond the vocabulary and a folder are named with the file and position") {
  TempDir d;
  write_llmc_shard(d.path + "/big.bin", {1, 70000, 3});  // uint32 tokens
  {
    std::fstream f(d.path + "/big.bin", std::ios::binary | std::ios::in | std::ios::out);
    const uint32_t huge = 0x80000005u;  // 2^31 + 5
    f.seekp(1024 + 4 * 2);
    f.write(reinterpret_cast<const char*>(&huge), 4);
  }
  const std::string e = error_of([&] { read_tokens(d.path + "/big.bin"); });
  CHECK(e.find(d.path + "/big.bin: token 2 (byte 1032) is id 2147483653") != std::string::npos);

  write_llmc_shard(d.path + "/s_0.bin", {1, 2, 3});
  write_llmc_shard(d.path + "/s_1.bin", {4, 5, 99, 6});
  const TokenStream s = read_tokens(d.path + "/s_*.bin");
  CHECK(s.file_ends() == std::vector<int64_t>{3, 7});
  CHECK_NOTHROW(s.check_below(100, "raise vocab_size"));
  CHECK(error_of([&] { s.check_below(50, "raise vocab_size"); })
            .find(d.path + "/s_1.bin: token 2 is id 99 but the model's vocab_size is 50; raise vocab_size") !=
        std::string::npos);

  const std::string folder = error_of([&] { read_tokens(d.path); });
  CHECK(folder.find("data.path \"" + d.path + "\" is a folder") != std::string::npos);
  CHECK(folder.find(d.path + "/*.bin") != std::string::npos);
}

TEST_CASE("bad inputs name the file and the fix") {
  TempDir d;
  CHECK(error_of([&] { read_tokens(d.path + "/missing*.txt"); }).find("matches no file") != std::string::npos);
  CHECK(error_of([&] { read_tokens(d.file("empty.txt", "")); }).find("empty.txt is empty") != std::string::npos);
  CHECK(error_of([&] { read_tokens(d.file("bad.bin", std::string(1024, 'x'))); }).find("is not an llm.c token shard") !=
        std::string::npos);
  write_llmc_shard(d.path + "/cut.bin", {1, 2, 3});
  ::truncate((d.path + "/cut.bin").c_str(), 1024 + 4);
  CHECK(error_of([&] { read_tokens(d.path + "/cut.bin"); }).find("truncated") != std::string::npos);
  CHECK(error_of([&] {
          read_tokens(d.file("x.jsonl", "{\"body\": 1}\n"));
        }).find("x.jsonl:1: expected an object with a string \"text\"") != std::string::npos);
  CHECK(error_of([] { split_sequences(10, 16, 0.0, "tiny.txt"); }).find("shorter than one sequence of 17") !=
        std::string::npos);
  const TokenStream s = counting(100);
  CHECK(error_of([&] { DistributedLoader(s, 0, 3, 8, 2, 0, 2, 1); }).find("cannot fill one step") != std::string::npos);
}

TEST_CASE("ranks read disjoint sequences; W ranks read what one rank with W times the batch reads") {
  const TokenStream s = counting(8 * 64 + 1);  // 64 sequences of 8 (+1)
  const Split split = split_sequences(s.size(), 8, 0.0, "counting");
  CHECK(split.train_sequences == 64);
  DistributedLoader one(s, 0, 64, 8, 8, 0, 1, 42);
  const std::vector<int64_t> all = firsts(one, 6);  // crosses an epoch (8 steps of 8 = 64)
  std::vector<int64_t> merged;
  for (int w : {2, 4}) {
    std::vector<std::vector<int64_t>> per_rank;
    for (int r = 0; r < w; ++r) {
      DistributedLoader l(s, 0, 64, 8, 8 / w, r, w, 42);
      per_rank.push_back(firsts(l, 6));
    }
    merged.clear();
    for (int step = 0; step < 6; ++step)
      for (int r = 0; r < w; ++r)
        for (int i = 0; i < 8 / w; ++i) merged.push_back(per_rank[r][step * (8 / w) + i]);
    CHECK(merged == all);
    std::set<int64_t> first_step;
    for (int r = 0; r < w; ++r)
      for (int i = 0; i < 8 / w; ++i) CHECK(first_step.insert(per_rank[r][i]).second);
  }
  // Targets are the inputs shifted by one token.
  DistributedLoader l(s, 0, 64, 8, 1, 0, 1, 42);
  const auto b = l.next();
  for (int t = 0; t < 8; ++t) CHECK(b.targets[t] == b.inputs[t] + 1);
  // Another seed reads another order; held-out sequences are never read for training.
  DistributedLoader other(s, 0, 64, 8, 8, 0, 1, 43);
  CHECK(firsts(other, 1) != std::vector<int64_t>(all.begin(), all.begin() + 8));
  DistributedLoader head(s, 0, 60, 8, 4, 0, 1, 42);
  for (int64_t f : firsts(head, 30)) CHECK(f < 60 * 8);
}

TEST_CASE("a saved position resumes the exact sequence of batches") {
  const TokenStream s = counting(8 * 40 + 1);
  DistributedLoader a(s, 0, 40, 8, 3, 1, 2, 7);
  firsts(a, 9);  // into the second epoch
  const auto pos = a.position();
  const auto expected = firsts(a, 10);
  DistributedLoader b(s, 0, 40, 8, 3, 1, 2, 7);
  b.set_position(pos);
  CHECK(firsts(b, 10) == expected);
}

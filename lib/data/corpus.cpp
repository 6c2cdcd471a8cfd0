#include "data/corpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "data/chat_records.h"
#include "data/documents.h"
#include "data/token_shard.h"
#include "util/crc32c.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hub_cache.h"
#include "util/json.h"
#include "util/strings.h"
#include "util/system_info.h"

namespace fsdp::data {

namespace {

using json = nlohmann::json;

// A document's ids and EOS, and how many of them (a prompt's) are not targets.
struct Encoded {
  std::vector<int32_t> ids;
  size_t prompt = 0;
  std::vector<uint8_t> counted;  // a conversation's: which ids the loss counts
};

// Each document's ids and EOS, encoded on `jobs` threads, in order.
std::vector<Encoded> encode_batch(const tokenize::Tokenizer& tok, int32_t eos, const std::vector<Document>& docs,
                                  int jobs, const ChatEncoder* chat, const std::string& file) {
  std::vector<Encoded> out(docs.size());
  std::vector<std::exception_ptr> errors(docs.size());
  auto work = [&](size_t first, size_t step) {
    for (size_t i = first; i < docs.size(); i += step) {
      try {  // nothing may escape a helper thread (it would end the process): kept for the caller
        if (docs[i].chat) {
          ChatEncoder::Encoded e = chat->encode(docs[i].text, str(file, ":", docs[i].line));
          out[i].ids = std::move(e.ids);
          out[i].counted = std::move(e.counted);
          continue;
        }
        out[i].ids = tok.encode(docs[i].text);
        if (docs[i].pair) {
          out[i].prompt = out[i].ids.size();
          const std::vector<int32_t> completion = tok.encode(docs[i].completion, /*add_special_tokens=*/false);
          out[i].ids.insert(out[i].ids.end(), completion.begin(), completion.end());
        }
        out[i].ids.push_back(eos);
      } catch (const std::bad_alloc&) {
        errors[i] = std::make_exception_ptr(
            Error(str(file, ":", docs[i].line, ": the record took more memory than this machine has to encode")));
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t n = std::min<size_t>(static_cast<size_t>(jobs), docs.size());
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n; ++t) threads.emplace_back(work, t, n);
  work(0, std::max<size_t>(n, 1));
  for (auto& t : threads) t.join();
  for (const std::exception_ptr& e : errors)  // the first bad record, in file order
    if (e) std::rethrow_exception(e);
  return out;
}

std::vector<std::string> expand_inputs(const CorpusOptions& o) {
  std::vector<std::string> files;
  for (const std::string& in : o.inputs) {
    const std::vector<std::string> found = glob_paths(in);
    FSDP_CHECK(!found.empty(), o.who, " ", quoted(in), " matches no file");
    for (const std::string& f : found) {
      if (is_directory(f) && hub::is_saved_dataset(f)) {  // datasets' save_to_disk: its Arrow files
        const hub::DatasetFiles saved = hub::saved_dataset_files(f, o.split);
        FSDP_CHECK(saved.error.empty(), o.who, " ", saved.error);
        files.insert(files.end(), saved.files.begin(), saved.files.end());
        continue;
      }
      FSDP_CHECK(!is_directory(f), o.who, " ", quoted(f), " is a folder; give files or a glob such as ",
                 folder_glob(f));
      files.push_back(f);
    }
  }
  return files;
}

void write_summary(const std::string& folder, const CorpusOptions& o, int32_t eos, const CorpusSummary& s) {
  json doc = {{"tokenizer", o.tokenizer_path},
              {"eos", eos},
              {"inputs", o.inputs},
              {"documents", s.documents},
              {"prompt_completion_pairs", s.pairs},
              {"conversations", s.conversations},
              {"tokens", s.tokens},
              {"counted_tokens", s.counted_tokens},
              {"shards", s.shards},
              {"token_bytes", s.token_bytes},
              {"longest_prompt",
               {{"tokens", s.longest_prompt.tokens}, {"file", s.longest_prompt.file}, {"line", s.longest_prompt.line}}},
              {"mask_format", kMaskFormat},
              {"crc32c", json::object()}};
  for (const auto& [name, crc] : s.checksums) doc["crc32c"][name] = crc_hex(crc);
  write_file_atomic(folder + "/tokenize.json", doc.dump(2) + "\n");
}

// Reads every file into `writer`, adding to `s`.
void tokenize_files(const tokenize::Tokenizer& tokenizer, int32_t eos, const CorpusOptions& o,
                    const std::vector<std::string>& files, const ChatEncoder* chat, ShardWriter& writer,
                    CorpusSummary& s, const CorpusProgress& progress) {
  const int jobs = o.jobs > 0 ? o.jobs : usable_cores();
  int64_t total = 0, before = 0;
  for (const std::string& f : files) total += std::max<int64_t>(0, file_size(f));
  for (const std::string& f : files) {
    DocumentReader reader(f, o.field, o.who, o.field_hint);
    for (auto docs = reader.next(size_t{4} << 20); !docs.empty(); docs = reader.next(size_t{4} << 20)) {
      const std::vector<Encoded> encoded = encode_batch(tokenizer, eos, docs, jobs, chat, f);
      for (size_t i = 0; i < docs.size(); ++i) {
        if (docs[i].chat) {
          writer.add(encoded[i].ids, encoded[i].counted);
          s.counted_tokens += std::count(encoded[i].counted.begin(), encoded[i].counted.end(), 1);
        } else {
          writer.add(encoded[i].ids, encoded[i].prompt);
          s.counted_tokens += static_cast<int64_t>(encoded[i].ids.size() - encoded[i].prompt);
        }
        s.tokens += static_cast<int64_t>(encoded[i].ids.size());
        s.pairs += docs[i].pair ? 1 : 0;
        s.conversations += docs[i].chat ? 1 : 0;
        if (static_cast<int64_t>(encoded[i].prompt) > s.longest_prompt.tokens)
          s.longest_prompt = {static_cast<int64_t>(encoded[i].prompt), f, docs[i].line};
      }
      s.documents += static_cast<int64_t>(docs.size());
      if (progress) progress(before + reader.bytes_read(), total, s.documents, s.tokens);
    }
    before += reader.bytes_read();
  }
  s.bytes = before;
}

}  // namespace

CorpusSummary tokenize_corpus(const tokenize::Tokenizer& tokenizer, int32_t eos, const CorpusOptions& o,
                              const CorpusProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  FSDP_CHECK(o.shard_tokens >= 1 && o.shard_tokens <= INT32_MAX, o.who, " --shard_size ", o.shard_tokens,
             " tokens: it must be between 1 and 2147483647 (llm.c's header counts in int32)");
  const std::vector<std::string> files = expand_inputs(o);
  FSDP_CHECK(!file_exists(o.output), o.who, " ", quoted(o.output),
             " already exists; give a new folder (nothing was written)");
  bool masks = false, conversations = false;  // any file of pairs or conversations (its first record says)
  for (const std::string& f : files) {
    DocumentReader r(f, o.field, o.who, o.field_hint);
    conversations = conversations || r.holds_conversations();
    masks = masks || r.holds_pairs() || r.holds_conversations();
  }
  std::unique_ptr<ChatEncoder> chat;
  if (conversations) {
    ChatOptions c = o.chat;
    if (c.folder.empty())
      c.folder = is_directory(o.tokenizer_path) ? o.tokenizer_path : parent_folder(o.tokenizer_path);
    chat = std::make_unique<ChatEncoder>(c, tokenizer);
  }
  const std::string partial = o.output + ".partial";
  remove_tree(partial);  // a cut-off earlier run's
  make_directories(partial);
  CorpusSummary s;
  s.token_bytes = tokenizer.vocab_size() <= 65536 ? 2 : 4;
  try {
    ShardWriter writer(partial, o.shard_tokens, s.token_bytes, masks, o.who);
    tokenize_files(tokenizer, eos, o, files, chat.get(), writer, s, progress);
    FSDP_CHECK(s.documents > 0, o.who, " the inputs hold no document");
    s.shards = writer.finish();
    s.checksums = writer.checksums();
    write_summary(partial, o, eos, s);
  } catch (...) {
    remove_tree(partial);
    throw;
  }
  FSDP_CHECK(::rename(partial.c_str(), o.output.c_str()) == 0, o.who, " cannot rename ", partial, " to ", o.output,
             ": ", std::strerror(errno));
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

CorpusSummary read_corpus_summary(const std::string& folder) {
  CorpusSummary s;
  const std::optional<json> found = try_read_json_file(folder + "/tokenize.json");
  if (!found || !found->is_object()) return s;
  const json& j = *found;
  s.documents = j.value("documents", int64_t{0});
  s.pairs = j.value("prompt_completion_pairs", int64_t{0});
  s.conversations = j.value("conversations", int64_t{0});
  s.tokens = j.value("tokens", int64_t{0});
  s.counted_tokens = j.value("counted_tokens", int64_t{0});
  s.shards = j.value("shards", int64_t{0});
  s.mask_format = j.value("mask_format", 1);
  s.token_bytes = j.value("token_bytes", 2);
  if (j.contains("crc32c") && j["crc32c"].is_object())
    for (const auto& [name, crc] : j["crc32c"].items()) {
      const std::string hex = crc.is_string() ? crc.get<std::string>() : "";
      char* end = nullptr;
      const unsigned long v = std::strtoul(hex.c_str(), &end, 16);
      if (hex.size() == 8 && end == hex.c_str() + 8) s.checksums[name] = static_cast<uint32_t>(v);
    }
  if (j.contains("longest_prompt") && j["longest_prompt"].is_object()) {
    const json& p = j["longest_prompt"];
    s.longest_prompt = {p.value("tokens", int64_t{0}), p.value("file", std::string()), p.value("line", int64_t{0})};
  }
  return s;
}

}  // namespace fsdp::data

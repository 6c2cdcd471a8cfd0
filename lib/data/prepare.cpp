#include "data/prepare.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "data/corpus.h"
#include "data/dataset.h"
#include "data/token_shard.h"
#include "tokenize/eos.h"
#include "tokenize/tokenizer.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hub_cache.h"
#include "util/strings.h"

namespace fsdp::data {

namespace {

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A file's content hash, read 4 MiB at a time.
uint64_t hash_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(fd >= 0, "[data] cannot read ", quoted(path), ": ", std::strerror(errno));
  std::vector<char> buf(size_t{4} << 20);
  uint64_t h = 0;
  for (ssize_t r; (r = ::read(fd, buf.data(), buf.size())) != 0;) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      ::close(fd);
      throw InputError(str("[data] cannot read ", quoted(path), ": ", std::strerror(errno)));
    }
    h = hash_bytes(buf.data(), static_cast<size_t>(r), h);
  }
  ::close(fd);
  return h;
}

// "path size mtime" of a file: what the stamp compares.
std::string stat_line(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return path + " missing\n";
  return str(path, " ", st.st_size, " ", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, "\n");
}

std::string absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[4096];
  return ::getcwd(cwd, sizeof(cwd)) ? std::string(cwd) + "/" + path : path;
}

// The tokenizer.json of data.tokenizer or model.pretrained ("" when neither names one).
std::string tokenizer_file(const DataOptions& o) {
  if (!o.tokenizer.empty()) {
    const std::string f = is_directory(o.tokenizer) ? o.tokenizer + "/tokenizer.json" : o.tokenizer;
    FSDP_CHECK(file_exists(f), "[data] data.tokenizer ", quoted(o.tokenizer), ": ", f, " is ", file_problem(f),
               "; give a Hugging Face tokenizer.json or the model folder holding it");
    return f;
  }
  if (!o.pretrained.empty() && file_exists(o.pretrained + "/tokenizer.json")) return o.pretrained + "/tokenizer.json";
  return "";
}

// The files that decide the tokens: the tokenizer, the files beside it that decide its EOS id and
// chat template, and a chat template given instead.
std::vector<std::string> tokenizer_files(const std::string& tokenizer_json, const DataOptions& o) {
  const std::string dir = parent_folder(tokenizer_json);
  std::vector<std::string> files = {tokenizer_json, dir + "/tokenizer_config.json", dir + "/config.json",
                                    dir + "/chat_template.jinja", dir + "/special_tokens_map.json"};
  if (!o.chat_template.empty()) files.push_back(o.chat_template);
  return files;
}

// The options that change the tokens of the same inputs.
std::string options_line(const DataOptions& o) {
  return str("field ", o.field, "\nassistant_only_loss ", o.assistant_only_loss ? 1 : 0, "\n");
}

// The stamp: the inputs' and tokenizer's paths, sizes and modification times, and the options.
std::string stamp_of(const DataPlan& plan, const DataOptions& o, const std::vector<std::string>& inputs) {
  std::string s = options_line(o);
  for (const std::string& f : tokenizer_files(plan.tokenizer, o)) s += stat_line(absolute(f));
  for (const std::string& f : inputs) s += stat_line(absolute(f));
  return s;
}

// The content key: the shard format, the tokenizer files, the field and every input's bytes.
std::string content_key(const DataPlan& plan, const DataOptions& o, const std::vector<std::string>& inputs) {
  const std::string options = options_line(o);
  uint64_t h = hash_bytes(options.data(), options.size(), 1 + kMaskFormat);  // a new format: a new key
  for (const std::string& f : tokenizer_files(plan.tokenizer, o))
    h = hash_bytes(&h, sizeof(h), file_exists(f) ? hash_file(f) : 2);
  for (const std::string& f : inputs) {
    const uint64_t content = hash_file(f);
    h = hash_bytes(&content, sizeof(content), h);
  }
  return hex(h);
}

std::string read_or_empty(const std::string& path) {
  return file_exists(path) ? read_file(path) : "";
}

// Removes what cut-off runs on this machine left in the cache: KEY.tmp-HOST-PID of a dead PID.
void remove_dead_partials(const std::string& cache_dir) {
  DIR* d = ::opendir(cache_dir.c_str());
  if (!d) return;
  const std::string mark = ".tmp-" + host_name() + "-";
  std::vector<std::string> dead;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const size_t at = name.find(mark);
    if (at == std::string::npos) continue;
    const long pid = std::atol(name.c_str() + at + mark.size());
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) dead.push_back(cache_dir + "/" + name);
  }
  ::closedir(d);
  for (const std::string& p : dead) remove_tree(p);
}

// Tokenizes the inputs into cache_dir/key: into a folder of this process's own, then renamed.
CorpusSummary make_cache(const DataPlan& plan, const DataOptions& o, const std::vector<std::string>& inputs,
                         const std::string& folder, std::ostream* progress) {
  remove_dead_partials(o.cache_dir);
  const tokenize::Tokenizer tok = tokenize::Tokenizer::load(plan.tokenizer);
  const int32_t eos = tokenize::eos_id(plan.tokenizer, tok);
  CorpusOptions c;
  c.inputs = inputs;
  c.output = str(folder, ".tmp-", host_name(), "-", ::getpid());
  c.field = o.field;
  c.field_hint = "data.field";
  c.who = "[data]";
  c.tokenizer_path = plan.tokenizer;
  c.shard_tokens = 100000000;
  c.chat.template_file = o.chat_template;
  c.chat.assistant_only = o.assistant_only_loss;
  c.chat.limits = o.template_limits;
  remove_tree(c.output);
  CorpusSummary s = tokenize_corpus(tok, eos, c, [&o, progress](int64_t done, int64_t total, int64_t, int64_t tokens) {
    if (o.interrupted && o.interrupted()) {
      if (progress) *progress << "\n";
      throw Error(str("[data] interrupted while tokenizing ", input_name(o), ": ", total > 0 ? 100 * done / total : 100,
                      "% of ", format_bytes(total),
                      " done, none of it kept; the next launch tokenizes it from "
                      "the start (for a corpus that takes long, tokenize it once with fsdptrain tokenize and "
                      "train on the shards: data.path: DIR/*.bin)"));
    }
    if (!progress) return;
    *progress << "\r[data] tokenizing: " << (total > 0 ? 100 * done / total : 100) << "% of " << format_bytes(total)
              << ", " << format_count(static_cast<double>(tokens)) << " tokens" << std::flush;
  });
  if (progress) *progress << "\n";
  if (::rename(c.output.c_str(), folder.c_str()) != 0) {
    const int err = errno;
    remove_tree(c.output);  // another process made it first: theirs is the same
    FSDP_CHECK(file_exists(folder + "/tokenize.json"), "[data] cannot rename ", c.output, " to ", folder, ": ",
               std::strerror(err));
  }
  return s;
}

}  // namespace

uint64_t hash_bytes(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed ^ (0x9E3779B97F4A7C15ULL * (n + 1));
  auto mix = [&h](uint64_t v) {
    h ^= v * 0xBF58476D1CE4E5B9ULL;
    h = (h << 27 | h >> 37) * 0x94D049BB133111EBULL + 0x632BE59BD9B4E019ULL;
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    mix(v);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  mix(tail ^ (static_cast<uint64_t>(n - i) << 59));
  h ^= h >> 31;
  return h * 0xD6E8FEB86659FD93ULL ^ (h >> 32);
}

std::vector<std::string> input_files(const DataOptions& o) {
  hub::DatasetFiles found;
  if (!o.dataset.empty())
    found = hub::dataset_files(o.dataset, o.config, o.split, o.revision);
  else if (is_directory(o.path) && hub::is_saved_dataset(o.path))
    found = hub::saved_dataset_files(o.path, o.split);
  else
    return glob_paths(o.path);
  FSDP_CHECK(found.error.empty(), "[data] ", o.dataset.empty() ? "data.path: " : "data.dataset: ", found.error);
  return found.files;
}

std::string input_name(const DataOptions& o) {
  return o.dataset.empty() ? o.path : str(o.dataset, o.config.empty() ? "" : "/" + o.config, " (", o.split, ")");
}

DataPlan plan_data(const DataOptions& o) {
  FSDP_CHECK(!o.path.empty() || !o.dataset.empty(),
             "[data] data.path is not set; give a text file, a .jsonl, .json or .parquet file, llm.c .bin shards, or "
             "a glob (or data.dataset: the Hub id of a dataset in the Hugging Face cache)");
  const std::vector<std::string> files = input_files(o);
  DataPlan plan;
  plan.path = o.path;
  const auto shards =
      std::count_if(files.begin(), files.end(), [](const std::string& f) { return ends_with(f, ".bin"); });
  if (files.empty() || shards == static_cast<long>(files.size())) return plan;  // read_tokens names a missing path
  FSDP_CHECK(shards == 0, "[data] data.path ", quoted(o.path),
             " matches both llm.c shards (.bin) and text; give one "
             "kind (tokenize the text with fsdptrain tokenize, then train on the shards)");
  plan.tokenizer = tokenizer_file(o);
  if (!plan.tokenizer.empty()) {
    plan.kind = DataKind::kTokenize;
    return plan;
  }
  FSDP_CHECK(o.dataset.empty() && !hub::is_saved_dataset(o.path), "[data] ", input_name(o),
             " has no tokenizer to be read with: set data.tokenizer to a tokenizer.json or the model folder holding "
             "it (a byte-level model reads only files named by data.path)");
  FSDP_CHECK(o.vocab_size == kByteVocabSize, "[data] data.path ", quoted(o.path), " is text, and the model's ",
             o.vocab_size,
             "-token vocabulary needs its tokenizer: set data.tokenizer to a tokenizer.json or the "
             "model folder holding it",
             o.pretrained.empty() ? "" : str(" (model.pretrained ", o.pretrained, " has no tokenizer.json)"),
             "; text is read as bytes only for a byte-level model (vocab_size 257)");
  plan.kind = DataKind::kBytes;
  return plan;
}

DataPlan prepare_data(const DataOptions& o, std::ostream* progress) {
  DataPlan plan = plan_data(o);
  if (plan.kind != DataKind::kTokenize) return plan;
  const std::vector<std::string> inputs = input_files(o);
  const std::string stamp = stamp_of(plan, o, inputs) + str("\nmask format ", kMaskFormat);
  const std::string stamp_file = o.cache_dir + "/stamps/" + hex(hash_bytes(stamp.data(), stamp.size()));
  std::string key = read_or_empty(stamp_file);
  if (key.empty() || !file_exists(o.cache_dir + "/" + key + "/tokenize.json")) key = content_key(plan, o, inputs);
  const std::string folder = o.cache_dir + "/" + key;
  plan.path = folder + "/*.bin";
  CorpusSummary s;
  if (file_exists(folder + "/tokenize.json")) {
    s = read_corpus_summary(folder);
    plan.note =
        str("[data] ", input_name(o), ": the tokens of ", plural(s.documents, "document"), " with ", plan.tokenizer,
            " are in ", folder, " (", s.tokens, " tokens; inputs unchanged, not tokenized again)");
  } else {
    make_directories(o.cache_dir);
    s = make_cache(plan, o, inputs, folder, progress);
    plan.note =
        str("[data] tokenized ", input_name(o), " (", plural(static_cast<long long>(inputs.size()), "file"), ", ",
            plural(s.documents, "document"), ") with ", plan.tokenizer, " into ", folder, ": ", s.tokens, " tokens in ",
            format_seconds(s.seconds),
            s.pairs > 0 ? str("; ", s.pairs, " prompt/completion pairs, loss on ", s.counted_tokens, " tokens")
            : s.conversations > 0
                ? str("; ", plural(s.conversations, "conversation"), " rendered with ",
                      o.chat_template.empty() ? "the model's chat template" : base_name(o.chat_template), ", loss on ",
                      s.counted_tokens, " tokens (", o.assistant_only_loss ? "the assistant's turns" : "all", ")")
                : std::string());
  }
  plan.longest_prompt = s.longest_prompt.tokens;
  plan.longest_prompt_at = str(s.longest_prompt.file, ":", s.longest_prompt.line);
  if (read_or_empty(stamp_file) != key) {  // every worker finds it; one writes it
    make_directories(o.cache_dir + "/stamps");
    write_file_atomic(stamp_file, key);
  }
  return plan;
}

}  // namespace fsdp::data

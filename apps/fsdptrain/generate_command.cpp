// `fsdptrain generate`: text from a trained model (a Hugging Face folder or a checkpoint), with its
// tokenizer, a KV cache, greedy or sampled decoding, streamed to the terminal (model/generate/generate.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "chat/chat_template.h"
#include "ckpt/load_model.h"
#include "ckpt/peft.h"
#include "commands.h"
#include "data/documents.h"
#include "model/generate/generate.h"
#include "model/kernels/provider.h"
#include "tokenize/eos.h"
#include "tokenize/tokenizer.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hub_cache.h"
#include "util/strings.h"
#include "util/system_info.h"

namespace fsdp::cli {

namespace {

using json = nlohmann::json;
constexpr int32_t kByteEnd = 256;  // the byte-level models' end-of-text id (data/dataset.h)

struct LoadedModel {
  model::CausalLM model{nullptr};
  std::string folder;
  std::string adapter;  // the LoRA adapter folded into it, if any
};

// The folder --model names, its config.json's model, and its weights (checked before they load);
// then the LoRA adapter folded in: --adapter's, or --model's own when it is an adapter folder
// (adapter_config.json, no config.json: its base is base_model_name_or_path), as PEFT's
// AutoPeftModelForCausalLM reads it.
LoadedModel load(std::string path, std::string adapter) {
  path = hub::model_folder(path);  // Hub ids: their snapshots in the Hugging Face cache
  adapter = hub::model_folder(adapter);
  if (adapter.empty() && file_exists(path + "/adapter_config.json") && !file_exists(path + "/config.json")) {
    adapter = path;
    path = ckpt::read_peft_adapter(adapter).base_model;
    FSDP_CHECK(!path.empty(), "[generate] ", adapter,
               "/adapter_config.json names no base model "
               "(base_model_name_or_path); give it as --model BASE --adapter ",
               adapter);
  }
  const ckpt::ModelFolder found = ckpt::find_model_folder(path);
  const model::DecoderConfig config = model::load_llama_config(found.folder + "/config.json");
  LoadedModel out{model::CausalLM(config), found.folder, adapter};
  ckpt::load_weights(*out.model, found, model::describe(config));
  if (!adapter.empty()) ckpt::apply_adapter(*out.model, ckpt::read_peft_adapter(adapter));
  return out;
}

// The model's text side: its tokenizer.json, or bytes for a byte-level model (vocab_size 257).
class TextCodec {
 public:
  TextCodec(const std::string& tokenizer_path, const std::string& model_folder, int64_t vocab_size) {
    std::string path = hub::model_folder(tokenizer_path);
    if (path.empty() && file_exists(model_folder + "/tokenizer.json")) path = model_folder;
    if (path.empty()) {
      FSDP_CHECK(vocab_size == 257, "[generate] ", model_folder, " has no tokenizer.json and its vocab_size is ",
                 vocab_size,
                 " (not a byte-level model's 257); pass --tokenizer with the model folder it was "
                 "trained with");
      return;
    }
    tokenizer_.emplace(tokenize::Tokenizer::load(path));
    FSDP_CHECK(tokenizer_->vocab_size() <= vocab_size, "[generate] the tokenizer ", path, " has ",
               tokenizer_->vocab_size(), " ids but the model's vocab_size is ", vocab_size, "; give its own tokenizer");
    folder_ = is_directory(path) ? path : parent_folder(path);
  }
  bool bytes() const { return !tokenizer_; }
  // --chat: prompts become a user message rendered with the chat template of the tokenizer's folder
  // (or `file`), with the generation prompt; generation also stops at the template's end of turn.
  void use_chat(const std::string& file) {
    FSDP_CHECK(tokenizer_,
               "[generate] --chat needs the model's tokenizer and chat template; this is a byte-level model");
    chat_.emplace(chat::ChatTemplate::load(folder_, file));
  }
  bool chat() const { return chat_.has_value(); }
  std::vector<int32_t> encode(const std::string& text) const {
    if (chat_) {  // the template writes the special tokens (BOS) itself, as apply_chat_template
      chat::Conversation c;
      c.messages.push_back(chat::Json{{"role", "user"}, {"content", text}});
      return tokenizer_->encode(chat_->render(c, /*add_generation_prompt=*/true), /*add_special_tokens=*/false);
    }
    if (tokenizer_) return tokenizer_->encode(text);
    std::vector<int32_t> ids{kByteEnd};  // as training saw documents: after an end-of-text id
    for (unsigned char ch : text) ids.push_back(ch);
    return ids;
  }
  // Ids the tokenizer does not have (a model's vocabulary padded past it) decode to nothing.
  std::string decode(const std::vector<int32_t>& ids) const {
    if (tokenizer_) {
      std::vector<int32_t> known;
      for (int32_t id : ids)
        if (tokenizer_->id_to_token(id)) known.push_back(id);
      return tokenizer_->decode(known);
    }
    std::string out;
    for (int32_t id : ids)
      if (id < 256) out += static_cast<char>(id);
    return out;
  }
  // generation_config.json's eos_token_id, else config.json's, else the tokenizer's EOS; bytes: 256.
  std::vector<int32_t> stop_ids(const std::string& model_folder) const {
    if (!tokenizer_) return {kByteEnd};
    for (const std::string& f : {model_folder + "/generation_config.json", model_folder + "/config.json",
                                 folder_ + "/generation_config.json", folder_ + "/config.json"})
      if (std::vector<int32_t> ids = tokenize::eos_token_ids(f); !ids.empty()) return ids;
    std::vector<int32_t> ids;
    try {
      ids = {tokenize::eos_id(folder_, *tokenizer_)};
    } catch (const InputError&) {  // none known: generate until max_new_tokens
    }
    if (chat_)
      if (const std::optional<int32_t> end = end_of_turn()) ids.push_back(*end);
    return ids;
  }

 private:
  // What the template writes right after an assistant's message, when that is an added token
  // (<|im_end|>, <|eot_id|>, </s>): where a chat reply ends.
  std::optional<int32_t> end_of_turn() const {
    const std::string probe = "fsdptrain-end-of-turn-probe";
    chat::Conversation c;
    c.messages.push_back(chat::Json{{"role", "user"}, {"content", "hi"}});
    c.messages.push_back(chat::Json{{"role", "assistant"}, {"content", probe}});
    std::string text;
    try {
      text = chat_->render(c, false);
    } catch (const Error&) {
      return std::nullopt;
    }
    const size_t at = text.rfind(probe);
    if (at == std::string::npos) return std::nullopt;
    const std::vector<int32_t> after = tokenizer_->encode(text.substr(at + probe.size()), false);
    if (after.empty() || !tokenizer_->is_added(after[0])) return std::nullopt;
    return after[0];
  }

 public:
 private:
  std::optional<tokenize::Tokenizer> tokenizer_;
  std::optional<chat::ChatTemplate> chat_;
  std::string folder_;
};

// Prints text as ids arrive, holding back a tail that ends inside a character (U+FFFD so far).
class Stream {
 public:
  Stream(const TextCodec& codec, std::ostream& out) : codec_(codec), out_(out) {}
  void add(int32_t id) {
    ids_.push_back(id);
    const std::string text = codec_.decode(ids_);
    if (ends_with(text, "\xEF\xBF\xBD")) return;
    flush(text);
  }
  void finish() { flush(codec_.decode(ids_)); }

 private:
  void flush(const std::string& text) {
    if (text.size() > printed_ && text.compare(0, printed_, shown_) == 0) out_ << text.substr(printed_) << std::flush;
    shown_ = text;
    printed_ = text.size();
  }
  const TextCodec& codec_;
  std::ostream& out_;
  std::vector<int32_t> ids_;
  std::string shown_;
  size_t printed_ = 0;
};

class GenerateCommand final : public Command {
 public:
  CLI::App* add(CLI::App& parent) override {
    CLI::App* app = parent.add_subcommand(
        "generate", "Generate text with a trained model (a Hugging Face folder or a checkpoint), streamed");
    app->add_option("--model", model_,
                    "A Hugging Face folder, a checkpoint step-N folder, a checkpoint.dir, or a LoRA adapter folder "
                    "(its base from adapter_config.json); or a model's Hub id (ORG/NAME) in the Hugging Face cache")
        ->required();
    app->add_option("--adapter", adapter_,
                    "A LoRA adapter folder (PEFT's, or a LoRA run's export; or its Hub id) to fold into --model");
    prompt_opt_ = app->add_option("--prompt", prompt_, "The prompt");
    auto* prompt = prompt_opt_;
    auto* prompts = app->add_option("--prompts", prompts_, "A JSONL file of {\"prompt\": ...} records");
    prompt->excludes(prompts);
    app->add_option("--output", output_, "With --prompts: the JSONL of completions to write (default: stdout)");
    app->add_option("--tokenizer", tokenizer_, "A tokenizer.json or its folder (default: the model folder's)");
    app->add_option("--max_new_tokens,--max-new-tokens", options_.max_new_tokens, "Tokens to generate (default 128)");
    app->add_option("--temperature", options_.temperature, "0 (default): greedy; above 0: sample");
    app->add_option("--top_p,--top-p", options_.top_p, "Sample from the most likely tokens up to this probability");
    app->add_option("--seed", options_.seed, "The sampling seed (default 0)");
    app->add_option("--device", device_, "cpu (default) or cuda");
    app->add_flag("--chat", chat_,
                  "Each prompt is a user message, rendered with the model's chat template and its generation prompt; "
                  "the reply stops at the template's end of turn");
    app->add_option("--chat_template,--chat-template", chat_template_, "With --chat: a template file instead");
    app->add_option("--threads", threads_,
                    "CPU threads for the model's work (default: one per 25M parameters, at most the usable cores; "
                    "a small model decodes fastest on one, and idle threads spin against other programs)");
    return app;
  }

  int run() override {
    const bool given = prompt_opt_->count() > 0;
    FSDP_CHECK(given || !prompts_.empty(), "fsdptrain generate: give --prompt TEXT or --prompts FILE.jsonl");
    FSDP_CHECK(!given || !prompt_.empty(), "--prompt is empty; give the text the model should continue");
    FSDP_CHECK(std::isfinite(options_.temperature) && options_.temperature >= 0, "--temperature: expected 0 (greedy) ",
               "or a number above 0, got ", options_.temperature);
    FSDP_CHECK(options_.max_new_tokens >= 1, "--max_new_tokens: expected >= 1, got ", options_.max_new_tokens);
    FSDP_CHECK(options_.top_p > 0 && options_.top_p <= 1, "--top_p: expected a probability in (0, 1], got ",
               options_.top_p);
    FSDP_CHECK(device_ == "cpu" || device_ == "cuda", "--device: expected cpu or cuda, got ", quoted(device_));
    FSDP_CHECK(device_ == "cpu" || at::hasCUDA(), "--device cuda: this machine has no CUDA device; use --device cpu");
    FSDP_CHECK(threads_ >= 0, "--threads: expected a number of threads >= 1, got ", threads_);
    // The kernels come from the environment (generate reads no config): a bad choice is named now,
    // before the model loads, not at the first token.
    const model::kernels::KernelChoice kernels = model::kernels::kernel_choice();
    FSDP_CHECK(!(device_ == "cuda" && kernels.provider == model::kernels::Provider::kHost),
               "[env] FSDPTRAIN_KERNELS=host is the CPU's kernels; with --device cuda use auto, portable or "
               "reference");
    LoadedModel loaded = load(model_, adapter_);
    loaded.model->eval();
    const int threads = threads_ > 0 ? threads_ : auto_threads(loaded.model->config.num_parameters());
    at::set_num_threads(threads);
    if (device_ == "cuda") loaded.model->to(c10::Device(c10::kCUDA, 0));
    TextCodec codec(tokenizer_, loaded.folder, loaded.model->config.vocab_size);
    FSDP_CHECK(chat_ || chat_template_.empty(), "--chat_template: give --chat too");
    if (chat_) codec.use_chat(chat_template_);
    options_.stop_ids = codec.stop_ids(loaded.folder);
    std::cerr << "[generate] " << loaded.folder << (loaded.adapter.empty() ? "" : " with the adapter " + loaded.adapter)
              << ": " << model::family_names(loaded.model->config.family).architecture << ", "
              << loaded.model->config.num_parameters() << " parameters on " << device_
              << (device_ == "cpu" ? str(" (", plural(threads, "thread"), ")") : std::string()) << "; "
              << (codec.bytes()  ? "byte-level text"
                  : codec.chat() ? "its tokenizer and chat template"
                                 : "its tokenizer")
              << "; "
              << (options_.temperature > 0 ? str("sampling at temperature ", options_.temperature, ", top_p ",
                                                 options_.top_p, ", seed ", options_.seed)
                                           : std::string("greedy"))
              << "\n";
    if (given) return one(*loaded.model, codec);
    return batch(*loaded.model, codec);
  }

 private:
  // Decoding does a token's work, 2 FLOPs a parameter, a few hundred small operations at a time: a
  // thread more pays only when each gets millions of parameters (about 25M each, measured on a
  // 2-core machine: the 124k-parameter quickstart model decodes 5.5x faster on one thread than on
  // two when the machine is busy, and as fast when it is idle).
  static int auto_threads(int64_t parameters) {
    const int64_t wanted = std::max<int64_t>(1, parameters / 25'000'000);
    return static_cast<int>(std::min<int64_t>(wanted, usable_cores()));
  }

  // The prompt's ids, and how many new tokens fit the model's positions.
  std::vector<int32_t> prompt_ids(const model::DecoderConfig& c, const TextCodec& codec, const std::string& text,
                                  const std::string& where, model::SamplingOptions& o) const {
    std::vector<int32_t> ids = codec.encode(text);
    const int64_t n = static_cast<int64_t>(ids.size()), limit = c.positions_computed();
    FSDP_CHECK(!ids.empty(), "[generate] ", where, ": the prompt has no tokens");
    FSDP_CHECK(n < limit, "[generate] ", where, ": the prompt is ", n, " tokens and the model has ", limit,
               limit < c.max_position_embeddings ? " positions fsdptrain computes (Ministral 3's unscaled queries)"
                                                 : " positions (max_position_embeddings)",
               "; shorten the prompt");
    o.max_new_tokens = std::min(o.max_new_tokens, limit - n);
    return ids;
  }

  int one(model::CausalLMImpl& m, const TextCodec& codec) {
    model::SamplingOptions o = options_;
    const std::vector<int32_t> ids = prompt_ids(m.config, codec, prompt_, "--prompt", o);
    if (o.max_new_tokens < options_.max_new_tokens)
      std::cerr << "[generate] " << o.max_new_tokens << " new tokens fit the model's positions\n";
    if (!codec.chat()) std::cout << prompt_ << std::flush;  // a chat prints the reply alone
    Stream stream(codec, std::cout);
    const model::Generation g = model::generate(m, ids, o, [&](int32_t id) { stream.add(id); });
    stream.finish();
    std::cout << std::endl;  // the text's last line ends before the statistics (on stderr) begin
    report(g, ids.size());
    return 0;
  }

  // Every prompt is read and checked before the first is generated, and --output is written whole
  // (a temporary renamed at the end): a bad line or a full disk leaves an earlier output as it was.
  int batch(model::CausalLMImpl& m, const TextCodec& codec) {
    struct Prompt {
      data::Document doc;
      std::vector<int32_t> ids;
      model::SamplingOptions options;
    };
    std::vector<Prompt> prompts;
    data::DocumentReader reader(prompts_, "prompt", "[generate]", "a \"prompt\" field");
    for (auto docs = reader.next(size_t{1} << 20); !docs.empty(); docs = reader.next(size_t{1} << 20))
      for (data::Document& d : docs) {
        Prompt p{std::move(d), {}, options_};
        p.ids = prompt_ids(m.config, codec, p.doc.text, str(prompts_, ":", p.doc.line), p.options);
        prompts.push_back(std::move(p));
      }
    std::optional<OutputFile> file;
    if (!output_.empty()) file.emplace(output_);
    int64_t tokens = 0;
    double seconds = 0;
    for (const Prompt& p : prompts) {
      const model::Generation g = model::generate(m, p.ids, p.options);
      // A byte-level model may end inside a character: invalid UTF-8 becomes U+FFFD, as decoders do.
      const std::string line = json{{"prompt", p.doc.text},
                                    {"completion", codec.decode(g.ids)},
                                    {"completion_ids", g.ids},
                                    {"prompt_tokens", p.ids.size()},
                                    {"stopped", g.stopped ? "eos" : "length"}}
                                   .dump(-1, ' ', false, json::error_handler_t::replace) +
                               "\n";
      if (file)
        file->write(line);
      else
        std::cout << line << std::flush;
      tokens += static_cast<int64_t>(g.ids.size());
      seconds += g.seconds;
    }
    if (file) file->commit();
    std::cerr << "[generate] " << plural(static_cast<long long>(prompts.size()), "prompt") << ", " << tokens
              << " new tokens in " << format_seconds(seconds) << ": "
              << format_count(static_cast<double>(tokens) / std::max(seconds, 1e-9)) << " tokens/s"
              << (output_.empty() ? "" : "; wrote " + output_) << "\n";
    return 0;
  }

  static void report(const model::Generation& g, size_t prompt_tokens) {
    const double decode = std::max(g.seconds - g.prefill_seconds, 1e-9);
    char line[256];
    std::snprintf(line, sizeof(line),
                  "[generate] %zu new tokens (%s) in %.2f s: %.1f tokens/s after a %zu-token prompt (%.3f s)\n",
                  g.ids.size(), g.stopped ? "ended at EOS" : "max_new_tokens", g.seconds,
                  g.ids.size() > 1 ? static_cast<double>(g.ids.size() - 1) / decode : 0.0, prompt_tokens,
                  g.prefill_seconds);
    std::cerr << line;
  }

  std::string model_, adapter_, prompt_, prompts_, output_, tokenizer_, device_ = "cpu";
  int threads_ = 0;  // 0: auto_threads
  bool chat_ = false;
  std::string chat_template_;
  CLI::Option* prompt_opt_ = nullptr;
  model::SamplingOptions options_;
};

}  // namespace

std::unique_ptr<Command> make_generate_command() {
  return std::make_unique<GenerateCommand>();
}

}  // namespace fsdp::cli

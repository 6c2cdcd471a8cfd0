#include "config/wizard.h"

#include <yaml-cpp/yaml.h>

#include <istream>
#include <numeric>
#include <ostream>
#include <set>

#include "config/loader.h"
#include "config/option.h"
#include "config/yaml_writer.h"
#include "util/error.h"
#include "util/files.h"
#include "util/hub_cache.h"
#include "util/strings.h"

namespace fsdp::config {

namespace {

// Question ids and prompts, in the order they can be asked.
const std::vector<WizardQuestionInfo>& questions() {
  static const std::vector<WizardQuestionInfo> q = {
      {"machine_type", "Which type of machine are you using?"},
      {"num_machines", "How many different machines will you use (use more than 1 for multi-node training)?"},
      {"machine_rank", "What is the rank of this machine?"},
      {"main_process_ip", "What is the IP address of the machine that will host the main process?"},
      {"main_process_port", "What is the port you will use to communicate with the main process?"},
      {"same_network", "Are all the machines on the same local network?"},
      {"rdzv_backend", "What rendezvous backend will you use? (static or c10d)"},
      {"debug",
       "Should distributed operations be checked while running for errors? This can avoid timeout issues but will be "
       "slower."},
      {"use_fsdp", "Do you want to use FullyShardedDataParallel?"},
      {"fsdp_config.fsdp_version", "What should be your FSDP version?"},
      {"fsdp_config.fsdp_sharding_strategy", "What should be your sharding strategy?"},
      {"fsdp_config.fsdp_reshard_after_forward", "Do you want to enable resharding after forward?"},
      {"fsdp_config.fsdp_offload_params", "Do you want to offload parameters and gradients to CPU?"},
      {"fsdp_config.fsdp_auto_wrap_policy", "What should be your auto wrap policy?"},
      {"use_model_layer_classes",
       "Do you want each of the model's decoder layers (its family's class: LlamaDecoderLayer, Qwen2DecoderLayer, "
       "...) to be a unit?"},
      {"fsdp_config.fsdp_transformer_layer_cls_to_wrap",
       "Specify the comma-separated list of transformer layer class names (case-sensitive) to wrap, e.g. "
       "Qwen2DecoderLayer"},
      {"fsdp_config.fsdp_min_num_params",
       "What should be your FSDP's minimum number of parameters for size-based wrapping?"},
      {"fsdp_config.fsdp_backward_prefetch", "What should be your FSDP's backward prefetch policy?"},
      {"fsdp_config.fsdp_state_dict_type", "What should be your FSDP's state dict type?"},
      {"fsdp_config.fsdp_forward_prefetch", "Do you want to enable FSDP's forward prefetch policy?"},
      {"fsdp_config.fsdp_use_orig_params", "Do you want to enable FSDP's `use_orig_params` feature?"},
      {"fsdp_config.fsdp_cpu_ram_efficient_loading",
       "Do you want each individually wrapped FSDP unit to broadcast module parameters from rank 0 at the start (only "
       "rank 0 reads the checkpoint)?"},
      {"fsdp_config.fsdp_sync_module_states",
       "Do you want to sync module states (broadcast rank 0's weights at start)?"},
      {"fsdp_config.fsdp_activation_checkpointing", "Do you want to enable FSDP activation checkpointing?"},
      {"use_partial_reshard",
       "Between forward and backward, keep each layer sharded over one machine's processes only (partial "
       "resharding: backward's all-gathers stay inside the machine, for that fraction of each layer's memory)?"},
      {"use_parallelism_config",
       "Do you want to use hybrid sharding (HSDP: shard within groups of ranks, replicate across groups)?"},
      {"parallelism_config.parallelism_config_dp_replicate_size", "How many replicas (dp_replicate_size)?"},
      {"parallelism_config.parallelism_config_dp_shard_size", "How many ranks shard each replica (dp_shard_size)?"},
      {"use_context_parallel",
       "Will you train on sequences too long for one GPU's memory, split over several processes (context parallel)?"},
      {"parallelism_config.parallelism_config_cp_size",
       "How many processes should split each sequence (cp_size; each holds 1/cp_size of its tokens)?"},
      {"parallelism_config.parallelism_config_cp_comm_strategy",
       "How should they exchange keys and values: allgather (gathered before attention) or alltoall (a ring: no "
       "process holds a whole sequence's)?"},
      {"num_processes", "How many processes (GPUs) should be used in total, across ALL machines?"},
      {"gpu_ids", "Which GPU(s) (by id) should be used on each machine, as a comma-separated list?"},
      {"mixed_precision", "Do you wish to use mixed precision?"},
      {"model.pretrained",
       "Which model should the built-in trainer fine-tune (a Hugging Face folder with config.json and safetensors "
       "weights, or its Hub id in the Hugging Face cache)? Leave it empty to launch your own program instead"},
      {"data.path",
       "What should it train on (a .jsonl or .parquet of text, prompt/completion or conversation records, a text "
       "file, llm.c .bin shards, a glob of them, a save_to_disk folder, or a dataset's Hub id in the cache)?"},
  };
  return q;
}

const std::string& prompt_of(const std::string& id) {
  for (const auto& q : questions())
    if (q.id == id) return q.prompt;
  FSDP_ASSERT(false, "no wizard question ", id);
  return questions().front().prompt;
}

class Wizard {
 public:
  Wizard(std::istream& in, std::ostream& out, const std::map<std::string, std::string>& preset, bool interactive,
         int gpus)
      : in_(in), out_(out), preset_(preset), interactive_(interactive), gpus_(gpus) {}

  WizardResult run();

 private:
  // The next line of input; at its end, "" (the default) when the question has one.
  std::string read_answer(const std::string& id, const std::string& shown_prompt, bool has_default = true);
  bool ask_yes_no(const std::string& id, bool def);
  std::string ask_choice(const std::string& id, const std::vector<std::string>& choices, const std::string& def);
  // Asks for an option-backed value; parsed by the option table's own rules.
  std::string ask_option(const std::string& key, const std::string& def,
                         const std::function<std::string(const std::string&)>& extra_check = nullptr);
  void set(const std::string& key, const std::string& value) { values_.emplace_back(key, value); }
  void set_bool(const std::string& key, bool value) { set(key, value ? "true" : "false"); }
  bool ask_and_set(const std::string& id, bool def) {
    const bool answer = ask_yes_no(id, def);
    set_bool(id, answer);
    return answer;
  }

  // The steps of run(), in the order Accelerate asks.
  bool ask_machines();  // returns whether FSDP is wanted
  void ask_fsdp();
  std::string ask_wrap_policy();
  void ask_hsdp();
  void ask_context_parallel();
  void ask_processes();
  void ask_partial_reshard();
  void ask_trainer();
  WizardResult finish();

  bool distributed_ = false, cpu_ = false, reshard_ = false;
  int machines_ = 1, replicate_ = 1, shard_ = 1, procs_ = 1, cp_ = 1;

  std::istream& in_;
  std::ostream& out_;
  const std::map<std::string, std::string>& preset_;
  bool interactive_;
  int gpus_;  // on this machine: without any, CPU training is the default
  std::vector<std::pair<std::string, std::string>> values_;
};

std::string Wizard::read_answer(const std::string& id, const std::string& shown_prompt, bool has_default) {
  out_ << shown_prompt << std::flush;
  std::string line;
  if (!std::getline(in_, line)) {
    if (has_default) {  // no more input (no terminal, an --answers file that leaves it out): the default
      out_ << "(default)\n";
      return "";
    }
    out_ << "\n";
    throw InputError(str("config: input ended before \"", prompt_of(id),
                         "\" was answered; answer it with --answers FILE (", id, ": ...)",
                         find_option(id) && !find_option(id)->flag.empty() ? " or --" + find_option(id)->flag : ""));
  }
  if (!interactive_) out_ << line << "\n";  // echo, so a piped transcript reads like a session
  return trim(line);
}

bool Wizard::ask_yes_no(const std::string& id, bool def) {
  if (auto it = preset_.find(id); it != preset_.end()) {
    auto b = parse_bool(it->second);
    FSDP_CHECK(b, "config: answer for ", id, ": expected yes or no, got ", quoted(it->second));
    return *b;
  }
  const std::string shown = prompt_of(id) + (def ? " [YES/no]: " : " [yes/NO]: ");
  while (true) {
    std::string a = read_answer(id, shown);
    if (a.empty()) return def;
    std::string l = to_lower(a);
    if (l == "yes" || l == "y") return true;
    if (l == "no" || l == "n") return false;
    out_ << "Please enter yes or no.\n";
  }
}

std::string Wizard::ask_choice(const std::string& id, const std::vector<std::string>& choices, const std::string& def) {
  auto match = [&](const std::string& a) -> std::string {
    if (auto n = parse_int(a); n && *n >= 1 && *n <= static_cast<long long>(choices.size())) return choices[*n - 1];
    for (const auto& c : choices)
      if (to_lower(c) == to_lower(a)) return c;
    return "";
  };
  if (auto it = preset_.find(id); it != preset_.end()) {
    std::string m = match(trim(it->second));
    FSDP_CHECK(!m.empty(), "config: answer for ", id, ": expected one of ", join(choices, ", "), ", got ",
               quoted(it->second));
    return m;
  }
  std::string shown = prompt_of(id) + "\n";
  for (size_t i = 0; i < choices.size(); ++i) shown += str("  ", i + 1, ") ", choices[i], "\n");
  shown += "[" + def + "]: ";
  while (true) {
    std::string a = read_answer(id, shown);
    if (a.empty()) return def;
    std::string m = match(a);
    if (!m.empty()) return m;
    out_ << str("Please enter a number from 1 to ", choices.size(), " or one of: ", join(choices, ", "), ".\n");
    shown = "[" + def + "]: ";
  }
}

std::string Wizard::ask_option(const std::string& key, const std::string& def,
                               const std::function<std::string(const std::string&)>& extra_check) {
  const OptionSpec* spec = find_option(key);
  FSDP_ASSERT(spec, key);
  auto parse = [&](const std::string& text, std::string* error) -> std::optional<std::string> {
    RawValue raw;
    raw.shape = RawValue::Shape::kScalar;
    raw.text = text;
    auto v = canonicalize(*spec, raw, error);
    if (v && extra_check) {
      std::string problem = extra_check(*v);
      if (!problem.empty()) {
        *error = problem;
        return std::nullopt;
      }
    }
    return v;
  };
  if (auto it = preset_.find(key); it != preset_.end()) {
    std::string error;
    auto v = parse(it->second, &error);
    FSDP_CHECK(v, "config: answer for ", key, ": ", error);
    return *v;
  }
  std::string prompt = prompt_of(key);
  if (cpu_ && key == "num_processes") prompt = "How many processes should be used in total, across ALL machines?";
  const std::string shown = prompt + (def.empty() ? " " : " [" + def + "]: ");
  while (true) {
    std::string a = read_answer(key, shown, !def.empty());
    if (a.empty()) {
      if (!def.empty())
        a = def;
      else {
        out_ << "Please enter a value.\n";
        continue;
      }
    }
    std::string error;
    if (auto v = parse(a, &error)) return *v;
    out_ << "Please try again: " << error << ".\n";
  }
}

WizardResult Wizard::run() {
  set("compute_environment", "LOCAL_MACHINE");
  const bool fsdp = ask_machines();
  set("distributed_type", fsdp ? "FSDP" : distributed_ ? (cpu_ ? "MULTI_CPU" : "MULTI_GPU") : "NO");
  if (fsdp) ask_fsdp();
  ask_processes();
  if (fsdp) ask_partial_reshard();
  set("mixed_precision", ask_choice("mixed_precision", {"no", "fp16", "bf16"}, "no"));
  ask_trainer();
  return finish();
}

// The built-in trainer's model and data, kept as absolute paths (the config is written elsewhere
// and launched from anywhere); no model: the config is for launching one's own program.
void Wizard::ask_trainer() {
  auto answer = [&](const std::string& id, bool optional) -> std::string {
    if (auto it = preset_.find(id); it != preset_.end()) return trim(it->second);
    while (true) {
      const std::string a = read_answer(id, prompt_of(id) + (optional ? " [none]: " : " "), optional);
      if (!a.empty() || optional) return a;
      out_ << "Please enter a value.\n";
    }
  };
  const std::string model = answer("model.pretrained", true);
  if (model.empty()) return;
  // A Hub id stays an id (each run finds its snapshot in the cache); a folder becomes absolute.
  const bool model_id = !is_directory(model) && hub::is_repo_id(model);
  FSDP_CHECK(!model_id || file_exists(hub::model_folder(model) + "/config.json"),
             "config: model.pretrained: ", quoted(model), " is no folder here, and ",
             hub::not_cached(hub::RepoType::kModel, model, "main"));
  FSDP_CHECK(model_id || file_exists(model + "/config.json"), "config: model.pretrained: ", quoted(model),
             " holds no config.json; give a Hugging Face model folder, or a model's Hub id in the Hugging Face cache");
  set("model.pretrained", model_id ? model : absolute_path(model));
  const std::string data = answer("data.path", false);
  if (glob_paths(data).empty() && hub::is_repo_id(data) &&
      !hub::find_snapshot(hub::RepoType::kDataset, data, "main").empty()) {
    set("data.dataset", data);  // a dataset in the cache, by its id
  } else {
    FSDP_CHECK(!glob_paths(data).empty(), "config: data.path: ", quoted(data), " matches no file",
               hub::is_repo_id(data) ? str(", and ", hub::not_cached(hub::RepoType::kDataset, data, "main")) : "");
    set("data.path", data[0] == '/' ? data : absolute_path(data));
  }
  // The run folder where the wizard ran (the config itself may live in ~/.cache/fsdptrain).
  set("train.output_dir",
      absolute_path("runs/" + base_name(model_id ? model : lexically_normal(absolute_path(model)))));
}

bool Wizard::ask_machines() {
  const std::string machine = ask_choice("machine_type", {"No distributed training", "multi-CPU", "multi-GPU"},
                                         gpus_ > 0 ? "multi-GPU" : "multi-CPU");
  distributed_ = machine != "No distributed training";
  cpu_ = machine == "multi-CPU";
  set_bool("use_cpu", cpu_);
  if (!distributed_) return false;
  machines_ = static_cast<int>(*parse_int(ask_option("num_machines", "1")));
  set("num_machines", std::to_string(machines_));
  if (machines_ > 1) {
    set("machine_rank", ask_option("machine_rank", "0", [&](const std::string& v) {
          return *parse_int(v) < machines_ ? std::string() : str("the rank must be 0..", machines_ - 1);
        }));
    set("main_process_ip", ask_option("main_process_ip", ""));
    set("main_process_port", ask_option("main_process_port", "29500", [](const std::string& v) {
          return v == "0" ? std::string("port 0 cannot be used with several machines") : std::string();
        }));
    if (!ask_and_set("same_network", true)) set("rdzv_backend", ask_option("rdzv_backend", "static"));
  }
  ask_and_set("debug", false);
  return ask_yes_no("use_fsdp", true);
}

void Wizard::ask_fsdp() {
  const std::string version = ask_choice("fsdp_config.fsdp_version", {"1", "2"}, "2");
  const bool v2 = version == "2";
  set("fsdp_config.fsdp_version", version);
  if (v2)
    reshard_ = ask_and_set("fsdp_config.fsdp_reshard_after_forward", true);
  else
    set("fsdp_config.fsdp_sharding_strategy",
        ask_choice("fsdp_config.fsdp_sharding_strategy", enum_names(kShardingStrategyNames), "FULL_SHARD"));
  ask_and_set("fsdp_config.fsdp_offload_params", false);
  const std::string policy = ask_wrap_policy();
  if (!v2)
    set("fsdp_config.fsdp_backward_prefetch",
        ask_choice("fsdp_config.fsdp_backward_prefetch", enum_names(kBackwardPrefetchNames), "BACKWARD_PRE"));
  const std::vector<std::string> sdt = v2 ? std::vector<std::string>{"SHARDED_STATE_DICT", "FULL_STATE_DICT"}
                                          : std::vector<std::string>{"FULL_STATE_DICT", "SHARDED_STATE_DICT"};
  set("fsdp_config.fsdp_state_dict_type", ask_choice("fsdp_config.fsdp_state_dict_type", sdt, sdt.front()));
  if (!v2) {
    ask_and_set("fsdp_config.fsdp_forward_prefetch", false);
    ask_and_set("fsdp_config.fsdp_use_orig_params", true);
  }
  const bool efficient = ask_and_set("fsdp_config.fsdp_cpu_ram_efficient_loading", true);
  if (!v2)
    set_bool("fsdp_config.fsdp_sync_module_states",
             efficient || ask_yes_no("fsdp_config.fsdp_sync_module_states", true));
  set_bool("fsdp_config.fsdp_activation_checkpointing",
           policy != "NO_WRAP" && ask_yes_no("fsdp_config.fsdp_activation_checkpointing", false));
  if (v2 && ask_yes_no("use_parallelism_config", false)) ask_hsdp();
  if (v2) ask_context_parallel();
}

std::string Wizard::ask_wrap_policy() {
  const std::string policy =
      ask_choice("fsdp_config.fsdp_auto_wrap_policy", enum_names(kWrapPolicyNames), "TRANSFORMER_BASED_WRAP");
  set("fsdp_config.fsdp_auto_wrap_policy", policy);
  if (policy == "TRANSFORMER_BASED_WRAP") {
    if (!ask_yes_no("use_model_layer_classes", true))
      set("fsdp_config.fsdp_transformer_layer_cls_to_wrap",
          ask_option("fsdp_config.fsdp_transformer_layer_cls_to_wrap", ""));
  } else if (policy == "SIZE_BASED_WRAP") {
    set("fsdp_config.fsdp_min_num_params",
        ask_option("fsdp_config.fsdp_min_num_params", "100000000", [](const std::string& v) {
          return *parse_int(v) > 0 ? std::string() : std::string("it must be > 0");
        }));
  }
  return policy;
}

void Wizard::ask_hsdp() {
  replicate_ = static_cast<int>(
      *parse_int(ask_option("parallelism_config.parallelism_config_dp_replicate_size", std::to_string(machines_))));
  shard_ = static_cast<int>(*parse_int(ask_option("parallelism_config.parallelism_config_dp_shard_size", "1")));
  set("parallelism_config.parallelism_config_dp_replicate_size", std::to_string(replicate_));
  set("parallelism_config.parallelism_config_dp_shard_size", std::to_string(shard_));
}

// Context parallel (FSDP2): how many processes split each sequence, and how they exchange K/V.
void Wizard::ask_context_parallel() {
  if (!ask_yes_no("use_context_parallel", false)) return;
  cp_ = static_cast<int>(*parse_int(ask_option("parallelism_config.parallelism_config_cp_size", "2",
                                                [](const std::string& v) {
                                                  return *parse_int(v) >= 2 ? std::string()
                                                                            : std::string("it must be 2 or more");
                                                })));
  set("parallelism_config.parallelism_config_cp_size", std::to_string(cp_));
  set("parallelism_config.parallelism_config_cp_comm_strategy",
      ask_choice("parallelism_config.parallelism_config_cp_comm_strategy", {"allgather", "alltoall"}, "allgather"));
}

void Wizard::ask_processes() {
  if (distributed_) {
    const int layout = replicate_ * shard_ > 1 ? replicate_ * shard_ * cp_ : 0;
    const int step = machines_ * cp_ / std::gcd(machines_, cp_);  // a multiple of the machines and of cp_size
    procs_ = static_cast<int>(*parse_int(ask_option(
        "num_processes", layout > 0 ? std::to_string(layout) : std::to_string(step), [&](const std::string& v) {
          long long n = *parse_int(v);
          if (n % machines_ != 0) return str("the total must be a multiple of the ", machines_, " machines");
          if (layout > 0 && n != layout)
            return str("HSDP needs replicate x shard", cp_ > 1 ? " x cp" : "", " = ", layout, " processes");
          if (n % cp_ != 0) return str("the total must be a multiple of cp_size ", cp_);
          return std::string();
        })));
  }
  set("num_processes", std::to_string(procs_));
  if (!distributed_ || cpu_) return;
  const int per_machine = procs_ / machines_;
  set("gpu_ids", ask_option("gpu_ids", "all", [&](const std::string& v) {
        if (v == "all") return std::string();
        int n = static_cast<int>(split(v, ',').size());
        return n >= per_machine ? std::string()
                                : str("each machine runs ", per_machine, " processes: list that many GPUs");
      }));
}

// FSDP2 over several machines: fsdp_reshard_after_forward may name one machine's processes instead
// of true (asked once the process count is known).
void Wizard::ask_partial_reshard() {
  // FSDP's shard group: dp_shard x cp ranks (all of them without HSDP).
  const int per_machine = procs_ / machines_, shard = replicate_ * shard_ > 1 ? shard_ * cp_ : procs_;
  if (!reshard_ || machines_ < 2 || per_machine < 2 || shard <= per_machine || shard % per_machine != 0) return;
  if (!ask_yes_no("use_partial_reshard", false)) return;
  for (auto& [key, value] : values_)
    if (key == "fsdp_config.fsdp_reshard_after_forward") value = std::to_string(per_machine);
}

// The answers as a config file, validated so a bug in the wizard's own checks cannot write a bad file.
WizardResult Wizard::finish() {
  WizardResult r;
  r.values = values_;
  r.yaml = emit_config_yaml(values_, "written by `fsdptrain config`; num_processes is the total across all machines");
  ConfigInputs check;
  check.file = "(wizard answers)";
  check.text = r.yaml;
  check.has_file = true;
  Diagnostics diags;
  load_config(check, diags);
  diags.throw_if_errors();
  return r;
}

}  // namespace

std::vector<WizardQuestionInfo> wizard_questions() {
  return questions();
}

WizardResult run_wizard(std::istream& in, std::ostream& out, const std::map<std::string, std::string>& preset,
                        bool interactive, int gpus) {
  for (const auto& [id, answer] : preset) {
    bool known = false;
    std::vector<std::string> ids;
    for (const auto& q : questions()) {
      ids.push_back(q.id);
      known |= q.id == id;
    }
    if (!known) {
      auto near = closest_match(id, ids);
      throw InputError(str("config: no question has the id ", quoted(id), near ? "; did you mean " + *near + "?" : "",
                           " (`fsdptrain config --list-questions` lists them)"));
    }
  }
  return Wizard(in, out, preset, interactive, gpus).run();
}

std::map<std::string, std::string> read_wizard_answers(const std::string& path) {
  const std::string text = read_file(path);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(str(path, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg));
  }
  FSDP_CHECK(root.IsMap(), path, ": expected a mapping of question id to answer, such as num_processes: 4");
  std::map<std::string, std::string> answers;
  for (const auto& kv : root) {
    const auto& v = kv.second;
    FSDP_CHECK(v.IsScalar() || (v.IsSequence() && v.size() > 0), path, ":", kv.first.Mark().line + 1, ": ",
               kv.first.Scalar(), ": expected a single answer");
    if (v.IsScalar()) {
      answers[kv.first.Scalar()] = v.Scalar();
    } else {
      std::vector<std::string> items;
      for (const auto& i : v) items.push_back(i.Scalar());
      answers[kv.first.Scalar()] = join(items, ",");
    }
  }
  return answers;
}

}  // namespace fsdp::config

#include "train/trainer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>

#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "config/show.h"
#include "data/dataset.h"
#include "dist/process_group.h"
#include "fsdp/config_map.h"
#include "fsdp/fully_shard.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "train/metrics.h"
#include "util/build_info.h"
#include "util/error.h"
#include "util/log.h"
#include "util/strings.h"

namespace fsdp::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

at::Tensor to_tensor(const std::vector<int64_t>& v, int64_t rows, int64_t cols, const c10::Device& device) {
  return at::tensor(v, at::kLong).view({rows, cols}).to(device);
}

// Sum over ranks of a double (the loss sum, a token count).
double global_sum(dist::ProcessGroup& world, double v, const c10::Device& device) {
  if (world.size() == 1) return v;
  at::Tensor t = at::full({1}, v, at::TensorOptions().dtype(at::kDouble).device(device));
  world.all_reduce(t).wait();
  return t.item<double>();
}

// Every rank's value of v, in rank order (collective).
std::vector<double> per_rank(dist::ProcessGroup& world, double v, const c10::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(device);
  at::Tensor mine = at::full({1}, v, opts), all = at::empty({world.size()}, opts);
  if (world.size() == 1) return {v};
  world.all_gather(all, mine).wait();
  const at::Tensor host = all.cpu();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + world.size());
}

// "1.2 GiB, 1.1 GiB": every rank's peak resident host memory so far (collective).
std::string host_peaks(dist::ProcessGroup& world, const c10::Device& device) {
  std::string out;
  for (double b : per_rank(world, static_cast<double>(peak_memory_bytes(c10::Device(c10::kCPU))), device))
    out += (out.empty() ? "" : ", ") + format_bytes(static_cast<long long>(b));
  return out;
}

}  // namespace

model::LlamaConfig model_config_of(const config::Config& cfg) {
  FSDP_CHECK(!cfg.model.config.empty() || !cfg.model.pretrained.empty(),
             "[train] neither model.config nor model.pretrained is set; give a Hugging Face config.json (such as "
             "configs/models/tiny/config.json) or a Hugging Face model folder to start from");
  return model::load_llama_config(cfg.model.config.empty() ? cfg.model.pretrained + "/config.json" : cfg.model.config);
}

TrainSummary run_training(const config::ResolvedConfig& rc, std::ostream& out, const TrainHooks& hooks) {
  const config::Config& cfg = rc.typed;
  const config::TrainConfig& tc = cfg.train;
  // One GPU per worker: the one numbered by its local rank among those it can see.
  const int gpus = cfg.launch.use_cpu ? 0 : cuda_device_count();
  const char* local_rank = std::getenv("LOCAL_RANK");
  const c10::Device device =
      gpus == 0
          ? c10::Device(c10::kCPU)
          : c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>((local_rank ? std::atoi(local_rank) : 0) % gpus));
  dist::GroupOptions go;
  go.backend = device.is_cuda() ? "nccl" : "gloo";
  dist::ProcessGroup world = dist::init_process_group(go);
  const bool main_rank = world.rank() == 0;
  auto say = [&](const std::string& line) {
    if (main_rank) out << line << std::flush;
  };
  say(config::format_resolved(rc, config::ShowFormat::kTable));

  // Data first: a bad path fails in a second, before any model is built.
  const model::LlamaConfig mc = model_config_of(cfg);
  std::unique_ptr<ckpt::HfCheckpoint> pretrained;
  if (!cfg.model.pretrained.empty()) pretrained = std::make_unique<ckpt::HfCheckpoint>(cfg.model.pretrained);
  const data::TokenStream stream = data::read_tokens(cfg.data.path);
  FSDP_CHECK(stream.max_token() < mc.vocab_size, "[data] ", cfg.data.path, " holds token id ", stream.max_token(),
             " but the model's vocab_size is ", mc.vocab_size, "; raise vocab_size in ",
             cfg.model.config.empty() ? cfg.model.pretrained + "/config.json" : cfg.model.config,
             " (byte-level text needs 257)");
  const int64_t T = tc.sequence_length, B = tc.micro_batch_size, accum = tc.gradient_accumulation_steps;
  const data::Split split =
      data::split_sequences(static_cast<int64_t>(stream.tokens.size()), T, cfg.data.eval_fraction, cfg.data.path);
  data::DistributedLoader loader(stream, 0, split.train_sequences, T, B, world.rank(), world.size(),
                                 static_cast<uint64_t>(tc.seed));
  say(str("[train] data: ", stream.files.size(), " file(s), ", stream.tokens.size(), " tokens; ", split.train_sequences,
          " training and ", split.eval_sequences, " held-out sequences of ", T, " tokens\n"));

  // The model, one layer at a time, each sharded as the engine takes it: no rank holds it whole.
  model::LlamaForCausalLM llama(mc, /*free_after_create=*/true);
  // Not FSDP (MULTI_CPU/MULTI_GPU): the plan replicates over every rank, plain data parallel.
  fsdp::FsdpPlan plan = fsdp::fsdp_plan_from_config(cfg, device);
  const uint64_t seed = static_cast<uint64_t>(tc.seed);
  plan.options.init = [&mc, seed](const std::string& name, at::IntArrayRef shape) {
    return model::init_parameter(mc, seed, name, shape);
  };
  if (pretrained) {  // checked before anything is built; the weights are loaded into the shards below
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (const auto& p : llama->named_parameters()) shapes.emplace_back(p.key(), p.value().sizes().vec());
    pretrained->check_matches(shapes);
    plan.options.init = [](const std::string&, at::IntArrayRef shape) { return at::zeros(shape); };
  }
  auto sharded = fsdp::fully_shard(*llama, model::llama_traits(mc),
                                   fsdp::make_mesh(world, plan.replicate_size, plan.shard_size), plan.options);
  if (pretrained) {
    const std::string before = host_peaks(world, device);
    const Clock::time_point t = Clock::now();
    ckpt::load_pretrained(*sharded, cfg.model.pretrained, world, cfg.fsdp.cpu_ram_efficient_loading);
    say(str("[train] loaded ", cfg.model.pretrained, " in ", seconds_since(t), " s (",
            cfg.fsdp.cpu_ram_efficient_loading ? "rank 0 read it and sent each rank its rows"
                                               : "each rank read its own rows",
            "); peak host memory per rank: ", before, " before, ", host_peaks(world, device), " after\n"));
  }
  optim::AdamWOptions ao{cfg.optimizer.lr, cfg.optimizer.beta1, cfg.optimizer.beta2, cfg.optimizer.eps,
                         cfg.optimizer.weight_decay};
  optim::ShardedAdamW adamw(*sharded, ao);
  const auto bytes = sharded->persistent_bytes();
  say(str("[train] model: ", mc.num_parameters(), " parameters, ", sharded->groups().size(), " units; per rank ",
          format_bytes(bytes.params), " of fp32 shards + ", format_bytes(bytes.grads), " of gradients + ",
          format_bytes(adamw.state_bytes()), " of AdamW state; ", world.size(), " rank(s) on ", device.str(), "\n"));

  // Checkpoints: resume first, so a bad checkpoint fails before any step.
  std::unique_ptr<ckpt::Checkpointer> checkpointer;
  const config::CheckpointConfig& cc = cfg.checkpoint;
  if (!cc.dir.empty() || !cc.resume.empty()) {
    ckpt::CheckpointOptions co;
    co.dir = cc.dir;
    co.keep = cc.keep;
    co.format = cfg.fsdp.state_dict_type == config::StateDictType::kShardedStateDict ? ckpt::Format::kSharded
                                                                                     : ckpt::Format::kFull;
    co.cpu_ram_efficient_loading = cfg.fsdp.cpu_ram_efficient_loading;
    co.fs = hooks.checkpoint_fs;
    co.log = main_rank ? &out : nullptr;
    checkpointer = std::make_unique<ckpt::Checkpointer>(*sharded, adamw, mc, world, co);
  }
  int64_t first_step = 1;
  TrainSummary summary;
  if (!cc.resume.empty()) {
    const std::string path = cc.resume == "latest" ? ckpt::latest_checkpoint(cc.dir) : cc.resume;
    if (path.empty()) {
      say(str("[train] checkpoint.resume is latest but ", cc.dir,
              " holds no complete checkpoint; starting at step 1\n"));
    } else {
      const std::string before = host_peaks(world, device);
      const ckpt::TrainingState st = checkpointer->load(path);
      say(str("[train] peak host memory per rank: ", before, " before loading, ", host_peaks(world, device),
              " after\n"));
      auto same = [&](const char* key, int64_t saved, int64_t now) {
        FSDP_CHECK(saved == now, "[train] ", path, " was saved with ", key, " ", saved, "; this run has ", now,
                   ", so the data would not continue where it stopped. Set ", key, " back to ", saved,
                   ", or start a new run (empty checkpoint.resume, another checkpoint.dir)");
      };
      same("train.seed", st.seed, tc.seed);
      same("train.sequence_length", st.sequence_length, T);
      FSDP_CHECK(st.train_sequences == split.train_sequences, "[train] ", path, " was saved from data with ",
                 st.train_sequences, " training sequences; data.path now gives ", split.train_sequences,
                 ", so the data would not continue where it stopped. Resume with the same data.path and "
                 "data.eval_fraction, or start a new run");
      loader.set_position({st.loader_epoch, st.loader_offset});
      first_step = st.step + 1;
      summary.resumed_from = st.step;
      summary.steps = st.step;
      if (st.step >= tc.steps)
        say(str("[train] ", path, " is at step ", st.step, " and train.steps is ", tc.steps,
                ": nothing left to train; raise train.steps to continue\n"));
    }
  }
  auto save_checkpoint = [&](int64_t step) {
    ckpt::TrainingState st;
    st.step = step;
    st.optimizer_steps = adamw.steps();
    st.loader_epoch = loader.position().epoch;
    st.loader_offset = loader.position().offset;
    st.seed = tc.seed;
    st.sequence_length = T;
    st.train_sequences = split.train_sequences;
    st.world_size = world.size();
    checkpointer->save(st);
  };

  std::ofstream metrics_file;
  if (main_rank && !cfg.logging.metrics_file.empty()) {
    metrics_file.open(cfg.logging.metrics_file, std::ios::app);
    FSDP_CHECK(metrics_file.good(), "[train] cannot open logging.metrics_file ", quoted(cfg.logging.metrics_file));
  }
  const std::optional<double> peak = peak_flops(device, cfg.logging.peak_tflops);
  const double flops_per_token = mc.flops_per_token(T);
  const double tokens_per_step = static_cast<double>(world.size() * B * T * accum);

  // Held-out loss: the mean over every held-out token the ranks read.
  auto evaluate = [&]() -> double {
    const int64_t eval_batch = std::min<int64_t>(B, split.eval_sequences / world.size());
    if (eval_batch < 1) return std::numeric_limits<double>::quiet_NaN();
    data::DistributedLoader eval_loader(stream, split.train_sequences, split.eval_sequences, T, eval_batch,
                                        world.rank(), world.size(), seed);
    c10::NoGradGuard no_grad;
    double sum = 0, count = 0;
    const int64_t batches = std::min<int64_t>(tc.eval_batches, split.eval_sequences / (eval_batch * world.size()));
    for (int64_t i = 0; i < batches; ++i) {
      const auto b = eval_loader.next();
      const at::Tensor x = to_tensor(b.inputs, eval_batch, T, device), y = to_tensor(b.targets, eval_batch, T, device);
      sum +=
          sharded->forward({x, y}, [&](const TensorList& in) { return TensorList{llama->loss_sum(in[0], in[1])}; })[0]
              .item<double>();
      count += static_cast<double>(eval_batch * T);
    }
    return global_sum(world, sum, device) / global_sum(world, count, device);
  };

  auto export_to = [&](int64_t step) {
    const std::string dir = str(cfg.checkpoint.export_dir, "/step-", step);
    const Clock::time_point t = Clock::now();
    ckpt::export_hf(*sharded, mc, dir);
    say(str("[train] exported a Hugging Face folder to ", dir, " in ", seconds_since(t), " s\n"));
  };

  const Clock::time_point start = Clock::now();
  // A live bar on the launcher's terminal (util/log.h); plain lines every logging.interval regardless.
  const char* progress_env = std::getenv("FSDPTRAIN_PROGRESS");
  const bool progress = main_rank && progress_env && std::string(progress_env) == "1";
  int64_t last_saved = summary.resumed_from;
  for (int64_t step = first_step; step <= tc.steps; ++step) {
    const Clock::time_point t0 = Clock::now();
    const double lr = optim::learning_rate(cfg.schedule, cfg.optimizer.lr, step, tc.steps);
    adamw.set_lr(lr);

    // data -> forward -> loss -> backward, per micro-batch. Each rank's loss sum is scaled so the
    // ranks' averaged gradients are those of the mean over the global batch's tokens.
    double loss_sum = 0;
    for (int64_t m = 0; m < accum; ++m) {
      sharded->set_requires_gradient_sync(m == accum - 1);
      const auto batch = loader.next();
      const at::Tensor x = to_tensor(batch.inputs, B, T, device), y = to_tensor(batch.targets, B, T, device);
      at::Tensor loss =
          sharded->forward({x, y}, [&](const TensorList& in) { return TensorList{llama->loss_sum(in[0], in[1])}; })[0];
      (loss / static_cast<double>(B * T * accum)).backward();
      loss_sum += loss.item<double>();
    }
    const double loss = global_sum(world, loss_sum, device) / tokens_per_step;
    // clip -> step. A NaN/inf loss or gradient stops the run (every rank sees the same values), or
    // skips the step so the weights stay finite.
    const double grad_norm = std::isfinite(loss) ? optim::clip_grad_norm(*sharded, cfg.optimizer.grad_clip) : loss;
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      const std::string what =
          std::isfinite(loss) ? str("the gradient norm is ", grad_norm) : str("the loss is ", loss);
      if (!tc.skip_nonfinite_loss)
        throw Error(str("[train] ", what, " at step ", step, "; lower optimizer.lr (it was ", lr,
                        "), check the data, or set train.skip_nonfinite_loss: true to skip such steps"));
      say(str("[train] step ", step, ": ", what, "; step skipped (train.skip_nonfinite_loss)\n"));
      sharded->zero_grad();
      continue;
    }
    adamw.step();
    sharded->zero_grad();

    // metrics.
    if (summary.steps == summary.resumed_from) summary.first_loss = loss;
    summary.last_loss = loss;
    summary.steps = step;
    const double step_time = seconds_since(t0);
    if (step % cfg.logging.interval == 0 || step == 1 || step == tc.steps) {
      StepMetrics m;
      m.step = step;
      m.steps = tc.steps;
      m.loss = loss;
      m.lr = lr;
      m.grad_norm = grad_norm;
      m.tokens_per_s = tokens_per_step / step_time;
      m.tokens_per_s_per_device = m.tokens_per_s / world.size();
      if (peak) m.mfu = flops_per_token * m.tokens_per_s_per_device / *peak;
      m.peak_memory_bytes = peak_memory_bytes(device);
      m.step_time_s = step_time;
      m.elapsed_s = seconds_since(start);
      say(format_metrics(m) + "\n");
      if (metrics_file.is_open()) metrics_file << metrics_json(m) << "\n" << std::flush;
    }
    if (progress)
      out << kProgressLinePrefix << progress_bar(step, tc.steps, summary.last_loss, seconds_since(start)) << std::endl;
    if (!cc.dir.empty() && cc.interval > 0 && step % cc.interval == 0 && step != tc.steps) {
      save_checkpoint(step);
      last_saved = step;
    }
    if (!cfg.checkpoint.export_dir.empty() && cfg.checkpoint.export_interval > 0 &&
        step % cfg.checkpoint.export_interval == 0 && step != tc.steps)
      export_to(step);
    if (tc.eval_interval > 0 && step % tc.eval_interval == 0 && step != tc.steps) {
      const double e = evaluate();
      if (std::isfinite(e)) {
        say(str("[train] step ", step, ": held-out loss ", e, "\n"));
        if (metrics_file.is_open()) metrics_file << "{\"step\": " << step << ", \"eval_loss\": " << e << "}\n";
      }
    }
  }
  const int64_t trained = summary.steps - summary.resumed_from;
  if (!cc.dir.empty() && summary.steps > last_saved) save_checkpoint(summary.steps);
  if (checkpointer) checkpointer->wait();
  if (!cfg.checkpoint.export_dir.empty() && trained > 0) export_to(summary.steps);
  summary.seconds = seconds_since(start);
  summary.tokens_per_s = trained > 0 ? tokens_per_step * trained / summary.seconds : 0;
  summary.eval_loss = evaluate();
  if (metrics_file.is_open() && std::isfinite(summary.eval_loss))
    metrics_file << "{\"step\": " << summary.steps << ", \"eval_loss\": " << summary.eval_loss << "}\n";
  char line[256];
  std::snprintf(line, sizeof(line),
                "[train] done: %lld steps in %.1f s; loss %.4f -> %.4f; held-out loss %.4f; %.0f tokens/s\n",
                static_cast<long long>(trained), summary.seconds, summary.first_loss, summary.last_loss,
                summary.eval_loss, summary.tokens_per_s);
  say(line);
  return summary;
}

}  // namespace fsdp::train

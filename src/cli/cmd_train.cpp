// ebb train: LoRA training over a frozen base model from a JSONL file
// (src/train/train_data.h for its formats), with AdamW, checkpoints and
// resume; writes the adapter in llama.cpp's GGUF adapter format.
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "cli/options.h"
#include "platform/timer.h"
#include "train/train_data.h"
#include "train/trainer.h"

namespace ebb::cli {
namespace {

struct TrainArgs {
  ModelArgs model;
  std::string data;
  std::string out;
  std::string init;          // continue this adapter
  int64_t rank = 8;
  float alpha = 16;
  std::string targets = "q,k,v,o,gate,up,down";
  float lr = 1e-4f;
  int64_t steps = 100;
  int64_t batch = 4;
  int64_t warmup = 0;
  float weight_decay = 0;
  float clip = 1.0f;
  int64_t max_tokens = 512;
  std::string checkpoint;    // directory
  int64_t checkpoint_every = 0;
  std::string resume;        // directory
  std::string recompute = "auto";
  uint64_t seed = 1;
  std::string format;
};

volatile std::sig_atomic_t g_stop = 0;
void on_sigint(int) { g_stop = 1; }

int train(TrainArgs& a) {
  std::unique_ptr<Engine> engine = make_engine(a.model);
  TrainDataOptions dop;
  dop.max_tokens = a.max_tokens;
  if (a.format.empty()) {
    dop.format = detect_chat_format(engine->model().chat_template(), engine->config().arch_name);
  } else {
    auto f = parse_chat_format(a.format);
    if (!f) throw UsageError("--format '" + a.format + "' is not one of chatml, llama3, llama2, plain");
    dop.format = *f;
  }
  std::vector<std::string> notes;
  std::vector<TrainSample> data = load_train_data(a.data, engine->tokenizer(), dop, &notes);
  for (const std::string& n : notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  int64_t tokens = 0;
  for (const TrainSample& s : data) tokens += static_cast<int64_t>(s.tokens.size());

  TrainerOptions o;
  o.init.rank = a.rank;
  o.init.alpha = a.alpha;
  o.init.seed = a.seed;
  try {
    o.init.targets = parse_lora_targets(a.targets);
  } catch (const Error& e) {
    throw UsageError(std::string("--targets: ") + e.what());
  }
  o.adamw.lr = a.lr;
  o.adamw.warmup_steps = a.warmup;
  o.adamw.total_steps = a.steps;
  o.adamw.weight_decay = a.weight_decay;
  o.adamw.grad_clip = a.clip;
  o.batch = a.batch;
  o.data_seed = a.seed;
  if (a.recompute == "auto") {
    o.recompute = TrainerOptions::Recompute::kAuto;
  } else if (a.recompute == "always") {
    o.recompute = TrainerOptions::Recompute::kAlways;
  } else if (a.recompute == "never") {
    o.recompute = TrainerOptions::Recompute::kNever;
  } else {
    throw UsageError("--recompute '" + a.recompute + "' is not one of auto, always, never");
  }
  if (a.steps < 1) throw UsageError("--steps must be at least 1");
  if (a.checkpoint_every < 0) throw UsageError("--checkpoint-every must be >= 0");

  std::unique_ptr<Trainer> t;
  if (!a.resume.empty()) {
    t = Trainer::resume(*engine, data, a.resume, &o);
    std::fprintf(stderr, "resumed %s at step %lld\n", a.resume.c_str(), static_cast<long long>(t->step()));
  } else if (!a.init.empty()) {
    const AdapterInfo info = engine->adapters().load(a.init);
    const AdapterSet set = engine->adapters().resolve(std::vector<AdapterBinding>{{info.name, 1.0f}});
    t = std::make_unique<Trainer>(*engine, data, o, set[0].v->lora.get());
  } else {
    t = std::make_unique<Trainer>(*engine, data, o);
  }
  std::fprintf(stderr, "ebb train: %s, %zu samples (%lld tokens), %zu pairs (%s), rank %lld, %lld steps of %lld\n",
               a.model.model.c_str(), data.size(), static_cast<long long>(tokens), t->params().pairs.size(),
               t->params().targets_summary().c_str(), static_cast<long long>(t->params().max_rank()),
               static_cast<long long>(a.steps), static_cast<long long>(a.batch));
  std::signal(SIGINT, on_sigint);
  Stopwatch clock;
  int64_t step_tokens = 0;
  double step_start = 0;
  bool stopped = false;
  while (t->step() < a.steps) {
    if (g_stop) {
      stopped = true;
      break;
    }
    const PhaseResult r = t->run_phase();
    step_tokens += r.tokens;
    if (!r.step_done) continue;
    const double now = clock.seconds();
    std::printf("step %lld/%lld | loss %.4f | grad norm %.3f | lr %.2e | %.0f tok/s | train memory %s\n",
                static_cast<long long>(t->step()), static_cast<long long>(a.steps), r.loss, r.grad_norm,
                static_cast<double>(r.lr), step_tokens / (now - step_start),
                format_bytes(t->bytes_now()).c_str());
    std::fflush(stdout);
    step_tokens = 0;
    step_start = now;
    if (!a.checkpoint.empty() && a.checkpoint_every > 0 && t->step() % a.checkpoint_every == 0) {
      t->save_checkpoint(a.checkpoint);
    }
  }
  std::signal(SIGINT, SIG_DFL);
  if (stopped) {
    std::fprintf(stderr, "stopped at a phase boundary in step %lld; ", static_cast<long long>(t->step() + 1));
    t->discard_step();
    if (!a.checkpoint.empty()) {
      t->save_checkpoint(a.checkpoint);
      std::fprintf(stderr, "checkpoint of step %lld in %s (--resume %s continues)\n", static_cast<long long>(t->step()),
                   a.checkpoint.c_str(), a.checkpoint.c_str());
    } else {
      std::fprintf(stderr, "no --checkpoint: the partial step is dropped\n");
    }
  } else if (!a.checkpoint.empty()) {
    t->save_checkpoint(a.checkpoint);
  }
  if (!a.out.empty()) write_lora_gguf(*t->snapshot(), a.out);
  std::fprintf(stderr, "%s%lld steps in %.1f s | peak training memory %s (engine total %s)\n",
               a.out.empty() ? "" : ("wrote " + a.out + " | ").c_str(), static_cast<long long>(t->step()),
               clock.seconds(), format_bytes(t->peak_bytes()).c_str(),
               format_bytes(engine->footprint().total()).c_str());
  return stopped ? 130 : 0;
}

}  // namespace

void add_train_command(CLI::App& app, int* rc) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* sub = app.add_subcommand("train", "Train a LoRA adapter over the frozen base model (AdamW, checkpoints)");
  add_model_options(sub, a->model);
  sub->add_option("--data", a->data, "JSONL samples: {\"text\"}, {\"prompt\",\"completion\"}, {\"messages\"} or "
                                     "{\"tokens\",\"weights\"}, each with an optional \"weight\"")->required();
  sub->add_option("-o,--output", a->out, "Write the trained adapter here (llama.cpp's GGUF adapter format)");
  sub->add_option("--lora-init", a->init, "Continue training this adapter instead of a new one");
  sub->add_option("-r,--rank", a->rank, "Rank of a new adapter")->capture_default_str();
  sub->add_option("--alpha", a->alpha, "alpha of a new adapter (scale alpha / rank)")->capture_default_str();
  sub->add_option("--targets", a->targets, "Projections to adapt, comma-separated")->capture_default_str();
  sub->add_option("--lr", a->lr, "Peak learning rate (AdamW)")->capture_default_str();
  sub->add_option("--steps", a->steps, "Optimizer steps (the cosine schedule ends here)")->capture_default_str();
  sub->add_option("--batch-size", a->batch, "Samples per step (gradient accumulation, one sample per micro-batch)")
      ->capture_default_str();
  sub->add_option("--warmup", a->warmup, "Linear learning-rate warm-up steps")->capture_default_str();
  sub->add_option("--weight-decay", a->weight_decay, "AdamW weight decay")->capture_default_str();
  sub->add_option("--clip", a->clip, "Clip the global gradient norm to this (0: off)")->capture_default_str();
  sub->add_option("--max-tokens", a->max_tokens, "Cut longer samples to this many tokens")->capture_default_str();
  sub->add_option("--checkpoint", a->checkpoint, "Directory for checkpoints (adapter, optimizer state, position)");
  sub->add_option("--checkpoint-every", a->checkpoint_every, "Also save a checkpoint every N steps (0: at the end)")
      ->capture_default_str();
  sub->add_option("--resume", a->resume, "Continue from a checkpoint directory, bit-exactly");
  sub->add_option("--recompute", a->recompute,
                  "Activations: auto (recompute layer by layer when they would pass the memory limit), always, never")
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "Seed of the adapter's initialisation and of the data order")->capture_default_str();
  sub->add_option("--format", a->format, "Chat format of \"messages\" samples (default: from the model)");
  sub->callback([a, rc] { *rc = train(*a); });
}

}  // namespace ebb::cli

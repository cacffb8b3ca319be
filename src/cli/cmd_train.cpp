// ebb train: LoRA training over a frozen base model from a JSONL file
// (src/train/train_data.h for its formats), with AdamW, checkpoints and
// resume; writes the adapter in llama.cpp's GGUF adapter format. Reports a
// progress line per step (loss, elapsed time, ETA), and on request the
// held-out loss (--eval), a line per step to a file (--log) and a chart of
// the losses (--plot).
#include <cmath>
#include <csignal>
#include <cstdio>
#include <map>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/options.h"
#include "cli/train_report.h"
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
  // 1e-3: what teaches stories260K a new fact in the README's example within
  // the default steps (1e-4 moved its loss too little to be seen).
  float lr = 1e-3f;
  int64_t steps = 100;
  double epochs = 0;         // --epochs N: steps from the data's size instead (0: --steps)
  std::string eval;          // held-out JSONL samples
  int64_t eval_every = 0;    // 0: ten evaluations over the run
  std::string plot;          // loss chart (SVG)
  std::string log;           // one JSON line per step
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
  ChatTemplateArgs chat_template;
};

// "1m05s", "2h03m", "12.3s"
std::string duration(double s) {
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600, static_cast<int>(s) % 3600 / 60);
  }
  return buf;
}

// Writes text to a file, or an Error naming it.
void write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
  if (!f.flush()) throw Error(std::string(what) + " '" + path + "': cannot write it");
}

volatile std::sig_atomic_t g_stop = 0;
void on_sigint(int) { g_stop = 1; }

int train(TrainArgs& a, bool steps_given) {
  // What cannot work is refused before the model loads.
  if (a.epochs < 0) throw UsageError("--epochs must be > 0");
  if (a.epochs > 0 && steps_given) throw UsageError("give --steps or --epochs, not both");
  if (a.eval_every < 0) throw UsageError("--eval-every must be >= 0");
  if (a.eval_every > 0 && a.eval.empty()) throw UsageError("--eval-every needs --eval FILE (held-out samples)");
  if (a.batch < 1) throw UsageError("--batch-size must be at least 1");
  std::unique_ptr<Engine> engine = make_engine(a.model);
  TrainDataOptions dop;
  dop.max_tokens = a.max_tokens;
  {
    ResolvedChatTemplate t = resolve_chat_template(a.chat_template, *engine, /*quiet=*/true);  // load_train_data notes the fallback
    dop.format = t.renderer.marker();
    if (t.renderer.is_jinja()) dop.renderer = std::make_shared<const ChatRenderer>(std::move(t.renderer));
    else if (a.chat_template.spec.empty()) dop.marker_note = t.source + " (--chat-template FILE gives one)";
  }
  std::vector<std::string> notes;
  std::vector<TrainSample> data = load_train_data(a.data, engine->tokenizer(), dop, &notes);
  std::vector<TrainSample> heldout;
  if (!a.eval.empty()) heldout = load_train_data(a.eval, engine->tokenizer(), dop, &notes);
  for (const std::string& n : notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  // Before any step (after the data is read, so its errors come first).
  if (a.out.empty() && a.checkpoint.empty()) {
    throw UsageError("-o ADAPTER.gguf is required: the trained adapter would be thrown away (or give --checkpoint DIR)");
  }
  int64_t tokens = 0;
  for (const TrainSample& s : data) tokens += static_cast<int64_t>(s.tokens.size());
  if (a.epochs > 0) {
    a.steps = std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil(a.epochs * static_cast<double>(data.size()) / static_cast<double>(a.batch))));
  }
  const int64_t eval_every = heldout.empty() ? 0 : a.eval_every > 0 ? a.eval_every : std::max<int64_t>(1, a.steps / 10);

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
  std::fprintf(stderr,
               "ebb train: %s, %zu samples (%lld tokens), %zu pairs (%s), rank %lld, %lld steps of %lld (%.2f epochs), "
               "lr %.2g%s\n",
               a.model.model.c_str(), data.size(), static_cast<long long>(tokens), t->params().pairs.size(),
               t->params().targets_summary().c_str(), static_cast<long long>(t->params().max_rank()),
               static_cast<long long>(a.steps), static_cast<long long>(a.batch),
               static_cast<double>(a.steps * a.batch) / static_cast<double>(data.size()), static_cast<double>(a.lr),
               heldout.empty() ? "" : (", " + std::to_string(heldout.size()) + " held-out samples").c_str());
  std::unique_ptr<std::ofstream> log;
  if (!a.log.empty()) {
    log = std::make_unique<std::ofstream>(a.log, std::ios::trunc);
    if (!*log) throw Error("--log '" + a.log + "': cannot write it");
  }
  std::vector<LossPoint> train_curve, eval_curve;
  auto evaluate = [&]() {
    const double l = heldout_loss(*engine, t->snapshot(), heldout);
    eval_curve.push_back({t->step(), l});
    return l;
  };
  if (eval_every > 0) {
    const double l = evaluate();
    std::printf("step %lld/%lld | eval loss %.4f (before training)\n", static_cast<long long>(t->step()),
                static_cast<long long>(a.steps), l);
  }
  std::signal(SIGINT, on_sigint);
  Stopwatch clock;
  int64_t step_tokens = 0;
  double step_start = 0;
  const int64_t first_step = t->step();
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
    train_curve.push_back({t->step(), r.loss});
    const bool eval_now = eval_every > 0 && (t->step() % eval_every == 0 || t->step() == a.steps);
    const double eval_loss = eval_now ? evaluate() : NAN;
    const int64_t done = t->step() - first_step;
    const double eta = now / static_cast<double>(done) * static_cast<double>(a.steps - t->step());
    char eval_part[48] = "";
    if (eval_now) std::snprintf(eval_part, sizeof eval_part, " | eval loss %.4f", eval_loss);
    std::printf("step %lld/%lld | loss %.4f%s | grad norm %.3f | lr %.2e | %.0f tok/s | %s, eta %s | train memory %s\n",
                static_cast<long long>(t->step()), static_cast<long long>(a.steps), r.loss, eval_part, r.grad_norm,
                static_cast<double>(r.lr), step_tokens / (now - step_start), duration(now).c_str(),
                duration(eta).c_str(), format_bytes(t->bytes_now()).c_str());
    std::fflush(stdout);
    if (log) {
      nlohmann::json j = {{"step", t->step()},       {"loss", r.loss},         {"grad_norm", r.grad_norm},
                          {"lr", r.lr},              {"tokens", step_tokens},  {"elapsed_s", now}};
      if (eval_now) j["eval_loss"] = eval_loss;
      *log << j.dump() << "\n";
      log->flush();
    }
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
  if (!a.plot.empty()) {
    write_file(a.plot, loss_chart_svg(train_curve, eval_curve, "ebb train: " + engine->config().name), "--plot");
    std::fprintf(stderr, "wrote the loss chart to %s\n", a.plot.c_str());
  }
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
  ModelOptionSet set;
  set.context = false;  // samples are cut to --max-tokens; no session context, KV or prefill batch
  set.budget = false;
  set.kv_memory = false;
  set.prefix_cache = false;
  set.lora = false;  // --lora-init continues an adapter
  add_model_options(sub, a->model, set);
  sub->add_option("--data", a->data, "JSONL samples: {\"text\"}, {\"prompt\",\"completion\"}, {\"messages\"} or "
                                     "{\"tokens\",\"weights\"}, each with an optional \"weight\"")->required();
  sub->add_option("-o,--output", a->out, "Write the trained adapter here (llama.cpp's GGUF adapter format); required");
  auto* steps = sub->add_option("--steps", a->steps, "Optimizer steps (the cosine schedule ends here)")
                    ->capture_default_str();
  sub->add_option("--epochs", a->epochs, "Passes over the data instead of --steps (steps = epochs x samples / batch)");
  sub->add_option("--lr", a->lr, "Peak learning rate (AdamW)")->capture_default_str();
  sub->add_option("--rank", a->rank, "Rank of a new adapter")->capture_default_str();
  sub->add_option("--batch-size", a->batch, "Samples per step (gradient accumulation, one sample per micro-batch)")
      ->capture_default_str();
  sub->add_option("--eval", a->eval, "Held-out JSONL samples: their loss is printed as training goes");
  sub->add_option("--eval-every", a->eval_every, "Steps between held-out evaluations (default: ten over the run)");
  sub->add_option("--log", a->log, "Write one JSON line per step here (step, loss, eval_loss, lr, tokens, time)");
  sub->add_option("--plot", a->plot, "Write an SVG chart of the training and held-out losses here");
  sub->add_option("--lora-init", a->init, "Continue training this adapter instead of a new one");
  add_chat_template_options(sub, a->chat_template);
  const char* g = "Optimizer, checkpoint and memory options";
  sub->add_option("--alpha", a->alpha, "alpha of a new adapter (scale alpha / rank)")->capture_default_str()->group(g);
  sub->add_option("--targets", a->targets, "Projections to adapt, comma-separated")->capture_default_str()->group(g);
  sub->add_option("--warmup", a->warmup, "Linear learning-rate warm-up steps")->capture_default_str()->group(g);
  sub->add_option("--weight-decay", a->weight_decay, "AdamW weight decay")->capture_default_str()->group(g);
  sub->add_option("--clip", a->clip, "Clip the global gradient norm to this (0: off)")->capture_default_str()->group(g);
  sub->add_option("--max-tokens", a->max_tokens, "Cut longer samples to this many tokens")->capture_default_str()->group(g);
  sub->add_option("--checkpoint", a->checkpoint, "Directory for checkpoints (adapter, optimizer state, position)")
      ->group(g);
  sub->add_option("--checkpoint-every", a->checkpoint_every, "Also save a checkpoint every N steps (0: at the end)")
      ->capture_default_str()
      ->group(g);
  sub->add_option("--resume", a->resume, "Continue from a checkpoint directory, bit-exactly")->group(g);
  sub->add_option("--recompute", a->recompute,
                  "Activations: auto (recompute layer by layer when they would pass the memory limit), always, never")
      ->capture_default_str()
      ->group(g);
  sub->add_option("--seed", a->seed, "Seed of the adapter's initialisation and of the data order")
      ->capture_default_str()
      ->group(g);
  sub->callback([a, rc, steps] { *rc = train(*a, steps->count() > 0); });
}

}  // namespace ebb::cli

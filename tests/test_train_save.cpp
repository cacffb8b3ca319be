// An adapter saved by `ebb train -o OUT.gguf` loads back (the registry, as
// `ebb run --lora` loads it) and gives the same logits as the adapter the
// same training leaves in memory: the GGUF round trip (alpha from scale x
// rank, F32 tensors, B stored transposed back) loses nothing.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/session.h"
#include "support.h"
#include "train/train_data.h"
#include "train/trainer.h"

namespace ebb {
namespace {

std::vector<float> logits_with(Engine& e, const std::vector<int32_t>& tokens, std::vector<AdapterBinding> set) {
  Session s(e);
  s.set_adapters(std::move(set));
  std::vector<float> l;
  s.feed(tokens, &l);
  return l;
}

TEST(TrainSave, TheSavedAdapterGivesTheInMemoryAdaptersLogits) {
  test::TempDir dir;
  const std::string data = dir.file("data.jsonl");
  {
    std::FILE* f = std::fopen(data.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("{\"text\": \"Once upon a time, there was a red fox named Zed. Zed loved to dance.\"}\n"
               "{\"prompt\": \"Lily saw\", \"completion\": \" a big red ball in the park.\", \"weight\": 0.5}\n"
               "{\"text\": \"Zed the fox danced in the snow, and the snow was white.\"}\n",
               f);
    std::fclose(f);
  }
  const std::string out = dir.file("out.gguf");
  const test::CliResult r = test::run_cli("train -m " + test::model_path("stories260K.gguf") + " --data " + data +
                                          " --rank 4 --alpha 8 --lr 1e-2 --steps 6 --batch-size 2 --seed 5"
                                          " --threads 2 -o " + out);
  ASSERT_EQ(r.status, 0) << r.err;

  // The same training in this process (the CLI's defaults spelled out).
  EngineOptions eo;
  eo.model_path = test::model_path("stories260K.gguf");
  eo.n_threads = 2;
  Engine engine(eo);
  TrainDataOptions dop;
  dop.max_tokens = 512;
  std::vector<TrainSample> samples = load_train_data(data, engine.tokenizer(), dop);
  TrainerOptions o;
  o.init.rank = 4;
  o.init.alpha = 8;
  o.init.seed = 5;
  o.data_seed = 5;
  o.adamw.lr = 1e-2f;
  o.adamw.total_steps = 6;
  o.batch = 2;
  Trainer t(engine, samples, o);
  EXPECT_EQ(t.run_steps(6), 6);
  t.stage("memory", /*publish=*/true);
  const AdapterInfo saved = engine.adapters().load(out, "saved");
  EXPECT_EQ(saved.rank, 4);

  const std::vector<int32_t>& tokens = samples[0].tokens;
  const std::vector<float> base = logits_with(engine, tokens, {});
  const std::vector<float> mem = logits_with(engine, tokens, {{"memory", 1.0f}});
  const std::vector<float> file = logits_with(engine, tokens, {{"saved", 1.0f}});
  ASSERT_EQ(mem.size(), file.size());
  ASSERT_EQ(mem.size(), base.size());
  size_t differ_from_base = 0, differ = 0;
  for (size_t i = 0; i < mem.size(); ++i) {
    differ_from_base += mem[i] != base[i];
    differ += mem[i] != file[i];
  }
  EXPECT_GT(differ_from_base, mem.size() / 2) << "the trained adapter changes nothing";
  EXPECT_EQ(differ, 0u) << "the saved adapter's logits differ from the in-memory adapter's";

  // ebb run --lora takes the file too.
  const test::CliResult run = test::run_cli("run -m " + test::model_path("stories260K.gguf") +
                                            " -p 'Once upon a time' -n 8 --temp 0 --threads 2 --lora " + out);
  EXPECT_EQ(run.status, 0) << run.err;
}

}  // namespace
}  // namespace ebb

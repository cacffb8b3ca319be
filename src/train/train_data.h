// Training samples from a JSONL file, one sample a line, any of:
//   {"text": "..."}                                   every token weighs 1
//   {"prompt": "...", "completion": "..."}            the completion's tokens weigh 1, the prompt's 0
//   {"messages": [{"role": "...", "content": "..."}]}  rendered with the chat
//       template (`renderer`: the model's Jinja template; else the marker
//       `format`); the assistant messages' tokens weigh 1, the rest 0: with
//       a Jinja template, each assistant turn's text from the end of the
//       generation prompt rendered before it through its end-of-turn token
//       (assistant_spans in model/chat_renderer.h)
//   {"tokens": [ids], "weights": [w per token]}       as given
// and optionally "weight": W (a reward or an advantage) multiplying every
// weight of the line. Lines longer than max_tokens are cut (the cut is
// reported through `notes`). Errors name the file, the line and the field;
// a line longer than max_line_bytes or a file longer than max_file_bytes is
// an error (reading stops there), and so is a "messages" line without an
// assistant turn (it would teach nothing).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "model/chat_renderer.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "train/trainer.h"

namespace ebb {

struct TrainDataOptions {
  int64_t max_tokens = 1024;
  uint64_t max_line_bytes = 0;         // 0: 64 bytes per max_tokens token, at least 1 MiB
  uint64_t max_file_bytes = 1ull << 30;
  ChatFormat format = ChatFormat::kPlain;                // without a renderer
  std::shared_ptr<const ChatRenderer> renderer;  // when set, renders messages (format unused)
  std::string marker_note;  // why the marker format (a fallback): noted once, at the first messages line
  bool add_bos = true;
};

std::vector<TrainSample> load_train_data(const std::string& path, const Tokenizer& tok, const TrainDataOptions& opts,
                                         std::vector<std::string>* notes = nullptr);

}  // namespace ebb

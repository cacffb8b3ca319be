// The slash commands of `ebb chat` that act on the engine's memory and
// adapters rather than on the conversation: each prints what it did on
// stderr and throws ebb::Error for a bad argument (the chat prints it and
// goes on). The conversation itself (turns, /shift, /save, /load) stays in
// cmd_chat.cpp.
#pragma once

#include <string>

#include "runtime/engine.h"
#include "runtime/session.h"

namespace ebb::cli {

// /lora                   list the loaded adapters and what this chat binds
// /lora load FILE [NAME]  load an adapter (GGUF file or PEFT directory)
// /lora bind NAME [SCALE] apply it from the next turn on
// /lora unbind NAME | all
// /lora scale NAME SCALE
void lora_command(Engine& engine, Session& session, const std::string& arg);
// /memory: the context's use and the bytes by category (and, with elastic
// memory, what is in RAM and on storage, layer by layer).
void memory_command(Engine& engine, const Session& session);
// /evict 50% or /evict 200MiB: percent of what can be evicted (layer weights
// and KV in RAM).
void evict_command(Engine& engine, const std::string& arg);
// /limit SIZE|PCT|off: caps weights and KV in RAM; answers stream the rest.
void limit_command(Engine& engine, const std::string& arg);
// /restore: reads back every evicted weight layer and KV chunk.
void restore_command(Engine& engine);

}  // namespace ebb::cli

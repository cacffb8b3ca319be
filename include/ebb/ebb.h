/* ebb: on-device LLM inference. The C API.
 *
 * Plain C (C99 and later, and C++). Link with libebb (pkg-config ebb, or
 * CMake find_package(ebb) and the target ebb::ebb).
 *
 * Handles
 *   ebb_engine   a loaded model, its memory (weights, KV of its sessions,
 *                compressed KV, swap files) and its compute threads.
 *   ebb_session  one conversation on an engine: its tokens and KV cache.
 *
 * Status and errors
 *   Every call that can fail returns an ebb_status. On anything but EBB_OK,
 *   ebb_last_error() returns a message naming what failed and why; the
 *   message is per thread and stays until the next failing call on that
 *   thread (a successful call leaves it alone). Outputs are written only on
 *   EBB_OK unless a function says otherwise. No C++ exception leaves the
 *   library: each one becomes a status. A bug inside the library (a broken
 *   internal invariant) still aborts the process with a message on stderr.
 *
 * Ownership
 *   - Handles are created by ebb_*_create / ebb_engine_load and freed by the
 *     matching ebb_*_free; freeing NULL is a no-op.
 *   - Every session must be freed before its engine: ebb_engine_free
 *     returns EBB_ERR_BUSY and frees nothing while the engine has sessions.
 *   - Strings and arrays passed in are copied or used only during the call;
 *     the caller keeps them.
 *   - Pointers the library returns (ebb_last_error, ebb_version,
 *     ebb_model_info's strings, ebb_session_logits, an ebb_residency) say
 *     how long they stay valid; an ebb_residency is freed with
 *     ebb_residency_free.
 *   - Buffers the caller provides take a capacity; when it is too small the
 *     call returns EBB_ERR_BUFFER_TOO_SMALL and writes the size needed to
 *     the count output, so a second call with a larger buffer succeeds.
 *
 * Thread safety
 *   - Calls on one engine, and on the sessions of that engine, are
 *     serialized by a lock inside the engine: any thread may call, and calls
 *     from several threads wait for one another. Different engines run
 *     independently and in parallel.
 *   - A text callback runs on the thread that called ebb_generate, with the
 *     engine's lock held (other threads' calls on the engine wait until the
 *     generation ends). It may call the functions that only read
 *     (tokenize, detokenize, model info, footprint, residency, session
 *     tokens); a call that would change the engine or a session (feed,
 *     generate, truncate, save, load, evict, restore, set a memory limit,
 *     create or free a session, free the engine) returns EBB_ERR_BUSY there.
 *   - ebb_last_error and ebb_version may be called from any thread at any
 *     time.
 *
 * Options structs
 *   Initialise each options struct with its ebb_*_options_default() and
 *   change the fields you need. The first field, struct_size, lets the
 *   library check that the struct was initialised that way and that it was
 *   compiled against the same header; a struct whose struct_size is wrong
 *   is refused with EBB_ERR_INVALID_ARGUMENT. New fields are only ever
 *   appended: where a struct gained fields (ebb_engine_options: device,
 *   n_gpu_layers), the size of its earlier version is accepted too, and the
 *   fields it lacks take their defaults, so a program built against an
 *   earlier ebb.h keeps working.
 *
 * Not here yet: training adapters, budget mode (streaming weights from a
 * fixed budget; the memory limit below is elastic memory's).
 */
#ifndef EBB_EBB_H
#define EBB_EBB_H

#include <stddef.h>
#include <stdint.h>

#if defined(EBB_BUILDING_LIBRARY) && (defined(__GNUC__) || defined(__clang__))
#define EBB_API __attribute__((visibility("default")))
#else
#define EBB_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------ */

typedef enum ebb_status {
  EBB_OK = 0,
  EBB_ERR_INVALID_ARGUMENT = 1, /* NULL handle or pointer, option out of range, bad token id */
  EBB_ERR_IO = 2,               /* a file cannot be opened, read or written */
  EBB_ERR_MODEL = 3,            /* the model file is malformed or not supported */
  EBB_ERR_CONTEXT_FULL = 4,     /* the tokens do not fit in the session's context */
  EBB_ERR_OUT_OF_MEMORY = 5,    /* an allocation failed */
  EBB_ERR_BUFFER_TOO_SMALL = 6, /* a caller's buffer is too small; the size needed is written */
  EBB_ERR_BUSY = 7,             /* not allowed now (sessions alive, or called from a callback) */
  EBB_ERR_FAILED = 8,           /* the request failed; ebb_last_error() says why */
  EBB_ERR_INTERNAL = 9          /* an unexpected error inside the library */
} ebb_status;

/* A short name of a status ("ok", "invalid_argument", ...); never NULL. */
EBB_API const char* ebb_status_name(ebb_status status);

/* The message of the last failing call on this thread, "" when none.
 * Valid until the next failing call on this thread. */
EBB_API const char* ebb_last_error(void);

/* The library version, "MAJOR.MINOR.PATCH". Static storage. */
EBB_API const char* ebb_version(void);

typedef int32_t ebb_token;

/* ---- engine ------------------------------------------------------------ */

typedef struct ebb_engine ebb_engine;
typedef struct ebb_session ebb_session;

typedef struct ebb_engine_options {
  size_t struct_size;         /* sizeof(ebb_engine_options), set by the default */
  const char* model_path;     /* GGUF file; required (default NULL) */
  int32_t n_threads;          /* compute threads, >= 0; 0: all hardware threads */
  int64_t kv_chunk_size;      /* tokens per KV chunk, >= 0 (default 0: from each session's context, 256 from 1024 tokens, less below) */
  int64_t prefill_batch;      /* tokens per prefill micro-batch, > 0 (default 64) */
  uint64_t memory_limit;      /* bytes of weights + KV + compressed KV in RAM; 0: none.
                                 Over it, layers are evicted and streamed. */
  const char* swap_dir;       /* directory of KV swap files; NULL: ~/.cache/ebb/swap */
  const char* profile_path;   /* device profile from `ebb profile`; NULL: built-in defaults */
  /* Appended later: a struct_size of the struct without these fields,
   * offsetof(ebb_engine_options, device), is accepted (they take their
   * defaults). */
  const char* device;         /* where the model runs: "cpu", "vulkan" (the first Vulkan device) or "vulkan:N"
                                 (the Nth, in the Vulkan loader's order); NULL (default): "cpu", or "vulkan" when
                                 n_gpu_layers > 0. On a device the weights, KV and LoRA adapters live in its memory;
                                 memory_limit there caps device and host memory together (docs/vulkan.md). */
  int32_t n_gpu_layers;       /* layers on the device, as llama.cpp's -ngl: -1 (default) or >= the model's layers:
                                 all; 0: none (the CPU). A split (0 < n < layers) is not supported yet. */
} ebb_engine_options;

EBB_API ebb_engine_options ebb_engine_options_default(void);

/* Loads a model. On EBB_OK *out is a new engine, freed with ebb_engine_free;
 * on failure *out is set to NULL. EBB_ERR_IO: the file cannot be opened; EBB_ERR_MODEL: it is not a model
 * ebb can run; EBB_ERR_INVALID_ARGUMENT: an option is out of range. */
EBB_API ebb_status ebb_engine_load(const ebb_engine_options* options, ebb_engine** out);

/* Frees the engine. EBB_ERR_BUSY (nothing freed) while sessions of it exist. */
EBB_API ebb_status ebb_engine_free(ebb_engine* engine);

typedef struct ebb_model_info {
  const char* architecture;  /* "llama", "qwen2", "qwen3"; valid while the engine lives */
  const char* name;          /* general.name, "" when absent; valid while the engine lives */
  int32_t n_vocab;
  int32_t n_layer;
  int64_t n_embd;
  int64_t n_ctx_train;       /* context length the model was trained for */
  ebb_token bos;             /* -1 when absent */
  ebb_token eos;             /* -1 when absent */
  ebb_token eot;             /* end of turn, -1 when absent */
  int32_t n_threads;         /* compute threads in use */
  const char* kernel_target; /* "scalar", "avx2", "avx512", "neon"; static storage */
} ebb_model_info;

EBB_API ebb_status ebb_engine_info(ebb_engine* engine, ebb_model_info* out);

/* ---- tokens ------------------------------------------------------------ */

/* Encodes text (len bytes; it need not end with NUL). add_bos: prepend BOS
 * when the vocabulary asks for it. parse_special: turn "<|im_start|>"-style
 * text into its control token. Writes up to capacity tokens and the count
 * to *n_tokens (the count needed on EBB_ERR_BUFFER_TOO_SMALL). */
EBB_API ebb_status ebb_tokenize(ebb_engine* engine, const char* text, size_t len, int add_bos, int parse_special,
                                ebb_token* tokens, size_t capacity, size_t* n_tokens);

/* Decodes tokens to UTF-8 text, NUL-terminated. special: control tokens
 * give their text. *n_bytes gets the text length without the NUL (the
 * length needed, without the NUL, on EBB_ERR_BUFFER_TOO_SMALL: capacity
 * must be at least *n_bytes + 1). */
EBB_API ebb_status ebb_detokenize(ebb_engine* engine, const ebb_token* tokens, size_t n_tokens, int special,
                                  char* text, size_t capacity, size_t* n_bytes);

/* ---- sessions ---------------------------------------------------------- */

typedef enum ebb_kv_type { EBB_KV_F16 = 0, EBB_KV_F32 = 1 } ebb_kv_type;

typedef struct ebb_session_options {
  size_t struct_size;    /* sizeof(ebb_session_options), set by the default */
  int64_t n_ctx;         /* context limit in tokens, >= 0; 0: min(training context, 4096) */
  int64_t kv_chunk_size; /* >= 0; 0: the engine's */
  ebb_kv_type kv_type;   /* default EBB_KV_F16 */
} ebb_session_options;

EBB_API ebb_session_options ebb_session_options_default(void);

/* A new empty conversation on the engine; freed with ebb_session_free
 * (before the engine). On failure *out is set to NULL. */
EBB_API ebb_status ebb_session_create(ebb_engine* engine, const ebb_session_options* options, ebb_session** out);
EBB_API ebb_status ebb_session_free(ebb_session* session);

/* Appends tokens to the conversation and runs them (and a token left
 * pending by the last ebb_generate) through the model. n_tokens may be 0
 * (on an empty session that does nothing). EBB_ERR_CONTEXT_FULL and
 * EBB_ERR_INVALID_ARGUMENT (a token outside the vocabulary) leave the
 * session unchanged. */
EBB_API ebb_status ebb_session_feed(ebb_session* session, const ebb_token* tokens, size_t n_tokens);

/* The logits after the last token run: *logits points to n_vocab floats
 * owned by the session, valid until the next call that changes it. */
EBB_API ebb_status ebb_session_logits(ebb_session* session, const float** logits, int32_t* n_vocab);

/* The conversation's tokens (prompt and generated, the pending one
 * included); same buffer protocol as ebb_tokenize. */
EBB_API ebb_status ebb_session_tokens(ebb_session* session, ebb_token* tokens, size_t capacity, size_t* n_tokens);

/* Forgets everything after the first n tokens (n <= the token count). */
EBB_API ebb_status ebb_session_truncate(ebb_session* session, size_t n);

/* Saves the tokens and KV to a file; load refuses a file of another model. */
EBB_API ebb_status ebb_session_save(ebb_session* session, const char* path);
EBB_API ebb_status ebb_session_load(ebb_session* session, const char* path);

/* ---- generation -------------------------------------------------------- */

/* Sampling, in this order: penalties over the last penalty_last_n tokens,
 * top-k, top-p, min-p, then temperature and a draw (see
 * src/runtime/sampler.h). */
typedef struct ebb_sampling_options {
  size_t struct_size;      /* sizeof(ebb_sampling_options), set by the default */
  float temperature;       /* >= 0; 0: greedy (default 0.8) */
  int32_t top_k;           /* >= 0; 0: off (default 40) */
  float top_p;             /* (0, 1]; 1: off (default 0.95) */
  float min_p;             /* [0, 1]; 0: off (default 0.05) */
  float repeat_penalty;    /* > 0; 1: off (default 1) */
  float frequency_penalty; /* >= 0; 0: off */
  float presence_penalty;  /* >= 0; 0: off */
  int32_t penalty_last_n;  /* tokens of history the penalties see (default 64) */
  uint64_t seed;           /* 0: a random seed, reported in ebb_generate_result */
} ebb_sampling_options;

EBB_API ebb_sampling_options ebb_sampling_options_default(void);

typedef struct ebb_generate_options {
  size_t struct_size;              /* sizeof(ebb_generate_options), set by the default */
  int64_t max_tokens;              /* tokens to generate at most, >= 0 (default 128) */
  ebb_sampling_options sampling;   /* initialised by ebb_generate_options_default */
  const char* const* stop_strings; /* generation ends before any of these; may be NULL */
  size_t n_stop_strings;
  int stop_at_eog;                 /* end at end-of-generation tokens (default 1) */
} ebb_generate_options;

EBB_API ebb_generate_options ebb_generate_options_default(void);

/* Receives each piece of generated text (UTF-8, `len` bytes, not
 * NUL-terminated, never splitting a character) as it becomes final. Return
 * 0 to go on, non-zero to stop: generation ends with EBB_STOP_CANCELLED. */
typedef int (*ebb_text_callback)(const char* text, size_t len, void* user_data);

typedef enum ebb_stop_reason {
  EBB_STOP_MAX_TOKENS = 0,
  EBB_STOP_END_OF_GENERATION = 1,
  EBB_STOP_STOP_STRING = 2,
  EBB_STOP_CONTEXT_FULL = 3,
  EBB_STOP_CANCELLED = 4
} ebb_stop_reason;

/* "max_tokens", "end_of_generation", "stop_string", "context_full",
 * "cancelled"; never NULL. */
EBB_API const char* ebb_stop_reason_name(ebb_stop_reason reason);

typedef struct ebb_generate_result {
  ebb_stop_reason stop;
  int64_t prompt_tokens;    /* tokens run in prefill (new this call) */
  int64_t generated_tokens;
  double prefill_seconds;
  double decode_seconds;
  double ttft_seconds;      /* from the call to the first text */
  uint64_t seed;            /* the seed used (drawn when options gave 0) */
} ebb_generate_result;

/* Feeds prompt (n_prompt may be 0 when the session has tokens), then
 * samples up to max_tokens tokens, calling on_text (may be NULL) with their
 * text. The generated tokens join the conversation (ebb_session_tokens);
 * the last one is left pending and runs first on the next feed or generate.
 * result may be NULL. A prompt that does not fit is EBB_ERR_CONTEXT_FULL
 * (session unchanged); a generation that fills the context is EBB_OK with
 * EBB_STOP_CONTEXT_FULL. */
EBB_API ebb_status ebb_generate(ebb_session* session, const ebb_token* prompt, size_t n_prompt,
                                const ebb_generate_options* options, ebb_text_callback on_text, void* user_data,
                                ebb_generate_result* result);

/* ---- memory ------------------------------------------------------------ */

/* Bytes by category, as counted by the engine's allocator. */
typedef struct ebb_footprint {
  uint64_t weights;        /* resident layer weights */
  uint64_t globals;        /* embedding, output norm, output head */
  uint64_t kv;             /* resident KV of all sessions */
  uint64_t scratch;        /* planned work buffers */
  uint64_t compressed;     /* compressed KV in RAM */
  uint64_t io_buffers;     /* direct-I/O staging and streaming windows */
  uint64_t total;          /* all of the above: the engine's RAM */
  uint64_t kv_stored;      /* KV in swap files (not in RAM) */
  uint64_t weights_stored; /* evicted weight layers (backed by the GGUF, not in RAM) */
  uint64_t adapters;       /* LoRA adapter tensors in RAM (counted in total too) */
  uint64_t adapters_stored; /* evicted adapter versions (backed by their files, not in RAM) */
} ebb_footprint;

EBB_API ebb_status ebb_engine_footprint(ebb_engine* engine, ebb_footprint* out);

typedef struct ebb_evict_result {
  uint64_t requested;
  uint64_t freed;          /* bytes given back */
  int64_t kv_chunks_compressed;
  int64_t kv_chunks_stored;
  int64_t weight_layers_dropped;
  double seconds;
} ebb_evict_result;

typedef struct ebb_restore_result {
  double seconds;
  uint64_t bytes_read;     /* from storage */
  int64_t weight_layers_loaded;
  int64_t kv_chunks_read;
  int64_t kv_chunks_decompressed;
} ebb_restore_result;

/* Gives back at least `bytes` of RAM (or all it can): first by dropping the
 * tensors of adapters no session is using (re-read from their files by the
 * next feed or generate that uses them), then by compressing KV, moving it
 * to swap files and dropping weight layers; result may be NULL. Later
 * requests restore what they need. */
EBB_API ebb_status ebb_engine_evict(ebb_engine* engine, uint64_t bytes, ebb_evict_result* result);
/* Restores everything evicted and waits for it; result may be NULL. */
EBB_API ebb_status ebb_engine_restore(ebb_engine* engine, ebb_restore_result* result);
/* Caps weights + KV + compressed KV + streaming buffers in RAM (0: no cap),
 * evicting down to it now; result (may be NULL) reports that eviction. On a
 * device (options.device) it caps what the engine holds on the device and
 * the host together: device layers are dropped now, and steps restore the
 * ones that fit and stream the rest; a limit no step could run under is
 * EBB_ERR_FAILED naming the sizes. */
EBB_API ebb_status ebb_engine_set_memory_limit(ebb_engine* engine, uint64_t bytes, ebb_evict_result* result);

typedef enum ebb_unit_state {
  EBB_UNIT_RESIDENT = 0,          /* in RAM */
  EBB_UNIT_COMPRESSED = 1,        /* KV chunk compressed in RAM */
  EBB_UNIT_STORED = 2,            /* in storage: a swap file (KV) or the GGUF (weights) */
  EBB_UNIT_STORED_COMPRESSED = 3, /* compressed KV chunk in a swap file */
  EBB_UNIT_LOST = 4               /* restore failed; recomputed from the tokens */
} ebb_unit_state;

/* A snapshot of where each layer's weights and KV chunks are. */
typedef struct ebb_residency {
  int32_t n_layer;
  const ebb_unit_state* weights;           /* [n_layer] each layer's weights */
  const int32_t* n_chunks;                 /* [n_layer] KV chunks of the layer, all sessions */
  const ebb_unit_state* const* chunks;     /* [n_layer][n_chunks[l]] state of each chunk */
  const char* grid;                        /* one line per layer, "L07 W |##cc ss|":
                                              'W' weights resident ('.' not), then per chunk
                                              '#' resident 'c' compressed 's' stored
                                              'z' stored compressed '!' lost */
} ebb_residency;

/* On EBB_OK *out is a snapshot owned by the caller, freed with
 * ebb_residency_free (NULL on failure); it does not change when the engine
 * does. */
EBB_API ebb_status ebb_engine_residency(ebb_engine* engine, ebb_residency** out);
EBB_API void ebb_residency_free(ebb_residency* residency);

/* ---- LoRA adapters ----------------------------------------------------- */

/* Reads a LoRA adapter for the engine's model: a GGUF adapter file
 * (llama.cpp's format) or a directory holding a PEFT checkpoint
 * (adapter_config.json, adapter_model.safetensors). It is known by `name`
 * (NULL or "": the file's name without ".gguf"; letters, digits, '-', '_'
 * and '.'). Loading other bytes under a name already loaded makes a new
 * version of it that the next turns use (generations already running keep
 * theirs); the same bytes again change nothing. Scales are per session
 * (ebb_session_set_adapters). EBB_ERR_IO: the path cannot be opened;
 * EBB_ERR_MODEL: it is not an adapter this model can use (the message names
 * the tensor and the shapes); EBB_ERR_INVALID_ARGUMENT: a bad name. */
EBB_API ebb_status ebb_adapter_load(ebb_engine* engine, const char* path, const char* name);

/* Forgets the adapter `name` (every version); its memory goes once no
 * session is using it. A session still bound to it fails its next feed or
 * generate with EBB_ERR_FAILED until it binds another set.
 * EBB_ERR_INVALID_ARGUMENT: no adapter has that name. */
EBB_API ebb_status ebb_adapter_unload(ebb_engine* engine, const char* name);

/* Binds the adapters names[0 .. n) to the session, each applied at its
 * scale (scales NULL: all 1.0; y += scale * (alpha / rank) * B A x on each
 * adapted projection); n = 0 unbinds them all (the base model). It takes
 * effect at the next feed or generate: when the set differs from the one
 * the session's KV was computed with, that KV is recomputed from the
 * tokens. EBB_ERR_INVALID_ARGUMENT: an unknown or repeated name, a NULL
 * name, a scale that is not finite (the binding is unchanged then). */
EBB_API ebb_status ebb_session_set_adapters(ebb_session* session, const char* const* names, const float* scales,
                                            size_t n);

/* ---- constrained output ------------------------------------------------ */

/* A grammar compiled for an engine's vocabulary: the generated text must be
 * a sentence of it (tokens it refuses are never sampled; the end-of-
 * generation token only once it is complete). Immutable: one constraint may
 * serve many generations, on any session of its engine, one after another
 * or from several threads. Freed with ebb_constraint_free (before its
 * engine). */
typedef struct ebb_constraint ebb_constraint;

/* GBNF text, llama.cpp's grammar format (a rule `root` is required).
 * EBB_ERR_INVALID_ARGUMENT with "grammar line L column C: why" when it does
 * not compile. */
EBB_API ebb_status ebb_constraint_from_gbnf(ebb_engine* engine, const char* gbnf, ebb_constraint** out);
/* JSON valid for a JSON Schema (text); NULL or "": any JSON object.
 * EBB_ERR_INVALID_ARGUMENT naming the JSON error (line, column) or the
 * schema path ("#/properties/age: ...") when it cannot be compiled. */
EBB_API ebb_status ebb_constraint_from_json_schema(ebb_engine* engine, const char* schema_json, ebb_constraint** out);
EBB_API void ebb_constraint_free(ebb_constraint* constraint);

/* ebb_generate whose output follows `constraint` (NULL: none, as
 * ebb_generate). The constraint starts from its beginning at every call. */
EBB_API ebb_status ebb_generate_constrained(ebb_session* session, const ebb_token* prompt, size_t n_prompt,
                                            const ebb_generate_options* options, const ebb_constraint* constraint,
                                            ebb_text_callback on_text, void* user_data, ebb_generate_result* result);

/* ---- chat: the model's template and tool calls -------------------------- */

/* Conversations are OpenAI-shaped JSON text: messages is an array of
 * {"role": "system"|"user"|"assistant"|"tool", "content": "..."}, an
 * assistant message may carry "tool_calls" ([{"id", "type": "function",
 * "function": {"name", "arguments"}}], arguments as an object or a JSON
 * string), a tool message "tool_call_id" and "name". tools is an array of
 * {"type": "function", "function": {"name", "description", "parameters"}}.
 *
 * They are rendered through the model's chat template
 * (tokenizer.chat_template, run as Jinja as Hugging Face transformers runs
 * it), or the one set with ebb_engine_set_chat_template. A model without a
 * template falls back to a marker format (chatml, llama3, llama2, plain,
 * chosen by its architecture), which takes no tools. */

/* Replaces the engine's chat template by Jinja `source` (NULL: back to the
 * model's own). EBB_ERR_INVALID_ARGUMENT naming line and column when it
 * does not parse. */
EBB_API ebb_status ebb_engine_set_chat_template(ebb_engine* engine, const char* source);

/* The prompt text for messages_json (and tools_json, NULL: none), ending
 * with the assistant's header when add_generation_prompt. Same buffer
 * protocol as ebb_detokenize. EBB_ERR_INVALID_ARGUMENT: not JSON, or the
 * template refuses the messages (its message is in ebb_last_error). */
EBB_API ebb_status ebb_chat_render(ebb_engine* engine, const char* messages_json, const char* tools_json,
                                   int add_generation_prompt, char* text, size_t capacity, size_t* n_bytes);

typedef enum ebb_tool_choice {
  EBB_TOOL_CHOICE_AUTO = 0,     /* the model decides; a call it starts is constrained to the tools */
  EBB_TOOL_CHOICE_NONE = 1,     /* the tools are shown, calls are not parsed */
  EBB_TOOL_CHOICE_REQUIRED = 2  /* the answer is constrained to call one of the tools */
} ebb_tool_choice;

typedef struct ebb_chat_options {
  size_t struct_size;               /* sizeof(ebb_chat_options), set by the default */
  ebb_generate_options generate;    /* initialised by ebb_chat_options_default */
  const char* tools_json;           /* NULL: no tools */
  ebb_tool_choice tool_choice;      /* default EBB_TOOL_CHOICE_AUTO */
  int parallel_tool_calls;          /* REQUIRED: one call or several (default 1) */
  const ebb_constraint* constraint; /* the answer's grammar (NULL: none); not with REQUIRED */
} ebb_chat_options;

EBB_API ebb_chat_options ebb_chat_options_default(void);

typedef struct ebb_tool_call {
  const char* id;        /* "call_" and 24 letters and digits */
  const char* name;      /* the function's name */
  const char* arguments; /* a JSON object, as text */
} ebb_tool_call;

typedef struct ebb_chat_result {
  const char* content;           /* the answer's text, without calls or reasoning */
  const char* reasoning_content; /* <think> text (Qwen3, DeepSeek-R1), "" when none */
  size_t n_tool_calls;
  const ebb_tool_call* tool_calls; /* [n_tool_calls] */
  const char* text;                /* the whole generated text, as generated */
  ebb_generate_result generate;
} ebb_chat_result;

/* One assistant turn: renders messages_json (and the options' tools) with
 * the generation prompt, keeps the session's tokens that the rendered
 * prompt starts with and feeds the rest, generates (on_text receives the
 * raw text, may be NULL) and parses the answer into content, reasoning and
 * tool calls in the template's family syntax (Qwen/Hermes <tool_call>,
 * Llama 3, Mistral [TOOL_CALLS], a generic JSON fallback). On EBB_OK *out is
 * a result owned by the caller, freed with ebb_chat_result_free (its
 * strings live as long as it). EBB_ERR_INVALID_ARGUMENT: bad JSON, a
 * template that refuses the messages, tools that do not compile to a
 * grammar (the message names the tool), tools with a model that has no
 * template. */
EBB_API ebb_status ebb_chat(ebb_session* session, const char* messages_json, const ebb_chat_options* options,
                            ebb_text_callback on_text, void* user_data, ebb_chat_result** out);
EBB_API void ebb_chat_result_free(ebb_chat_result* result);

#ifdef __cplusplus
}
#endif

#endif /* EBB_EBB_H */

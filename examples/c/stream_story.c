/* Streams a story from a small model through ebb's C API.
 *
 *   stream_story MODEL.gguf [PROMPT] [N_TOKENS] [SEED] [ADAPTER [SCALE]]
 *
 * e.g. stream_story ../shared/models/stories260K.gguf "Once upon a time" 64
 * ADAPTER: a LoRA adapter (GGUF or PEFT directory) applied at SCALE
 * (default 1), e.g. ../shared/golden/lora/stories260K.lora-r4.gguf.
 * The story goes to standard output as it is generated; a summary line and
 * any error go to standard error. Exit status 0 on success, 1 on an error,
 * 2 on bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ebb/ebb.h>

/* Stops the story at the first blank line after min_bytes of text. */
typedef struct story_state {
  size_t bytes;
  int newlines_in_row;
  size_t min_bytes;
} story_state;

static int on_text(const char* text, size_t len, void* user_data) {
  story_state* st = (story_state*)user_data;
  size_t i;
  fwrite(text, 1, len, stdout);
  fflush(stdout);
  for (i = 0; i < len; ++i) {
    st->newlines_in_row = text[i] == '\n' ? st->newlines_in_row + 1 : 0;
    if (st->newlines_in_row >= 2 && st->bytes + i >= st->min_bytes) return 1; /* stop */
  }
  st->bytes += len;
  return 0;
}

/* Prints the failed call, its status and the library's message. */
static int report(const char* what, ebb_status s) {
  fprintf(stderr, "stream_story: %s failed (%s): %s\n", what, ebb_status_name(s), ebb_last_error());
  return 1;
}

int main(int argc, char** argv) {
  const char* prompt = argc > 2 ? argv[2] : "Once upon a time";
  long n_tokens = argc > 3 ? strtol(argv[3], NULL, 10) : 128;
  unsigned long long seed = argc > 4 ? strtoull(argv[4], NULL, 10) : 42;
  const char* adapter = argc > 5 ? argv[5] : NULL;
  float scale = argc > 6 ? strtof(argv[6], NULL) : 1.0f;
  ebb_engine_options eo;
  ebb_session_options so;
  ebb_generate_options go;
  ebb_generate_result result;
  ebb_engine* engine = NULL;
  ebb_session* session = NULL;
  ebb_token* tokens = NULL;
  size_t n_prompt = 0;
  story_state state = {0, 0, 200};
  ebb_status s;
  int rc = 1;

  if (argc < 2 || argc > 7 || n_tokens < 0) {
    fprintf(stderr, "usage: %s MODEL.gguf [PROMPT] [N_TOKENS] [SEED] [ADAPTER [SCALE]]\n", argv[0]);
    return 2;
  }

  eo = ebb_engine_options_default();
  eo.model_path = argv[1];
  eo.n_threads = 2;
  s = ebb_engine_load(&eo, &engine);
  if (s != EBB_OK) return report("loading the model", s);

  /* Ask for the count first, then tokenize into a buffer of that size. */
  s = ebb_tokenize(engine, prompt, strlen(prompt), 1, 0, NULL, 0, &n_prompt);
  if (s != EBB_OK && s != EBB_ERR_BUFFER_TOO_SMALL) {
    rc = report("tokenizing", s);
    goto done;
  }
  tokens = (ebb_token*)malloc((n_prompt > 0 ? n_prompt : 1) * sizeof(ebb_token));
  if (!tokens) goto done;
  s = ebb_tokenize(engine, prompt, strlen(prompt), 1, 0, tokens, n_prompt, &n_prompt);
  if (s != EBB_OK) {
    rc = report("tokenizing", s);
    goto done;
  }

  so = ebb_session_options_default();
  s = ebb_session_create(engine, &so, &session);
  if (s != EBB_OK) {
    rc = report("creating a session", s);
    goto done;
  }
  if (adapter) {
    const char* names[1] = {"adapter"};
    s = ebb_adapter_load(engine, adapter, names[0]);
    if (s != EBB_OK) {
      rc = report("loading the adapter", s);
      goto done;
    }
    s = ebb_session_set_adapters(session, names, &scale, 1);
    if (s != EBB_OK) {
      rc = report("binding the adapter", s);
      goto done;
    }
  }

  go = ebb_generate_options_default();
  go.max_tokens = n_tokens;
  go.sampling.seed = seed;
  fputs(prompt, stdout);
  s = ebb_generate(session, tokens, n_prompt, &go, on_text, &state, &result);
  fputc('\n', stdout);
  if (s != EBB_OK) {
    rc = report("generating", s);
    goto done;
  }
  fprintf(stderr, "prompt %lld tok | generated %lld tok in %.3f s | ttft %.1f ms | seed %llu | stop %s\n",
          (long long)result.prompt_tokens, (long long)result.generated_tokens, result.decode_seconds,
          result.ttft_seconds * 1e3, (unsigned long long)result.seed, ebb_stop_reason_name(result.stop));
  rc = 0;

done:
  free(tokens);
  ebb_session_free(session);
  ebb_engine_free(engine);
  return rc;
}

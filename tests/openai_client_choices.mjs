// Drives a running `ebb serve` (test_serve_choices.cpp starts it on
// stories260K) with the official `openai` npm client: n choices, greedy
// choices identical, seeded choices repeating, chat logprobs with
// top_logprobs sorted, the client's own accumulation of a streamed n = 2
// response matching the whole one, vLLM's return_token_ids (sent as an extra
// body field, as clients do), a stop token id and logit_bias.
//
//   node tests/openai_client_choices.mjs BASE_URL API_KEY MODEL NPM_PREFIX
//
// Prints one line per check and "openai client choices: all checks passed";
// any failure exits 1 with its reason.
import assert from 'node:assert/strict';
import { connect, check } from './openai_client_common.mjs';

const { model, client } = connect('openai_client_choices.mjs');

const base = {
  model,
  messages: [{ role: 'user', content: 'Tell me about a cat' }],
  max_tokens: 12,
  ignore_eos: true,
};

async function main() {
  await check('n = 3 gives three choices', async () => {
    const r = await client.chat.completions.create({ ...base, n: 3, temperature: 1, seed: 5 });
    assert.equal(r.choices.length, 3);
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    assert.equal(r.usage.completion_tokens, 36);
  });

  await check('greedy n = 2 gives identical choices', async () => {
    const r = await client.chat.completions.create({ ...base, n: 2, temperature: 0 });
    assert.equal(r.choices[0].message.content, r.choices[1].message.content);
  });

  const seeded = { ...base, n: 3, temperature: 1, seed: 42 };
  let whole;
  await check('a seeded n = 3 repeats', async () => {
    const a = await client.chat.completions.create(seeded);
    const b = await client.chat.completions.create(seeded);
    assert.deepEqual(
      a.choices.map((c) => c.message.content),
      b.choices.map((c) => c.message.content),
    );
    whole = a;
  });

  await check('top_logprobs sorted, greedy picks the first', async () => {
    const r = await client.chat.completions.create({ ...base, temperature: 0, logprobs: true, top_logprobs: 4 });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, 12);
    for (const t of content) {
      assert.equal(t.top_logprobs.length, 4);
      for (let i = 1; i < 4; ++i) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
      assert.equal(t.token, t.top_logprobs[0].token);
      assert.equal(t.logprob, t.top_logprobs[0].logprob);
    }
    assert.equal(content.map((t) => t.token).join(''), r.choices[0].message.content);
  });

  await check('a streamed seeded n = 3 accumulates to the whole response', async () => {
    const runner = client.chat.completions.stream({ ...seeded, stream: true });
    const done = await runner.finalChatCompletion();
    assert.equal(done.choices.length, 3);
    for (const c of done.choices) assert.equal(c.message.content, whole.choices[c.index].message.content);
  });

  let ids;
  await check('return_token_ids gives prompt and completion ids', async () => {
    const r = await client.completions.create({
      model,
      prompt: 'Once upon a time',
      max_tokens: 12,
      temperature: 0,
      ignore_eos: true,
      return_token_ids: true,
    });
    assert.ok(Array.isArray(r.prompt_token_ids) && r.prompt_token_ids.length > 0);
    ids = r.choices[0].token_ids;
    assert.equal(ids.length, 12);
  });

  await check('a stop token id ends the choice', async () => {
    const stop = ids[5];
    const first = ids.indexOf(stop);
    const r = await client.completions.create({
      model,
      prompt: 'Once upon a time',
      max_tokens: 12,
      temperature: 0,
      ignore_eos: true,
      return_token_ids: true,
      stop_token_ids: [stop],
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].token_ids.length, first + 1);
  });

  await check('logit_bias bans a token', async () => {
    const r = await client.completions.create({
      model,
      prompt: 'Once upon a time',
      max_tokens: 12,
      temperature: 0,
      ignore_eos: true,
      return_token_ids: true,
      logit_bias: { [String(ids[0])]: -100 },
    });
    assert.ok(!r.choices[0].token_ids.includes(ids[0]));
  });
}

main().then(
  () => console.log('openai client choices: all checks passed'),
  (e) => {
    console.error(`openai client choices: FAILED: ${e.stack ?? e}`);
    process.exit(1);
  },
);

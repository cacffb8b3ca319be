// Drives a running `ebb serve` with the official `openai` npm client
// (test_serve.cpp starts the server and runs this script):
//
//   node tests/openai_client.mjs BASE_URL API_KEY MODEL NPM_PREFIX
//
// NPM_PREFIX is where scripts/setup.sh installed the package
// (npm install --prefix BUILD/npm openai). Prints one line per check and
// "openai client: all checks passed"; any failure exits 1 with its reason.
import assert from 'node:assert/strict';
import { connect, check } from './openai_client_common.mjs';

const { baseURL, apiKey, model, mod, OpenAI, client } = connect('openai_client.mjs');

async function main() {
  await check('models.list names the base model', async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    assert.ok(ids.includes(model), `ids: ${ids.join(', ')}`);
  });

  const chat = {
    model,
    messages: [{ role: 'user', content: 'Tell me a story about a dog.' }],
    max_tokens: 16,
    temperature: 0,
  };
  let plain;
  await check('chat.completions.create', async () => {
    const r = await client.chat.completions.create(chat);
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    plain = r;
  });

  await check('chat.completions.create streamed equals plain, with usage', async () => {
    const s = await client.chat.completions.create({ ...chat, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let usage = null;
    let finish = null;
    for await (const chunk of s) {
      if (chunk.usage) usage = chunk.usage;
      const c = chunk.choices[0];
      if (!c) continue;
      text += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(text, plain.choices[0].message.content);
    assert.equal(finish, plain.choices[0].finish_reason);
    assert.ok(usage, 'no usage chunk');
    assert.equal(usage.completion_tokens, plain.usage.completion_tokens);
  });

  await check('completions.create (plain and streamed)', async () => {
    const req = { model, prompt: 'Once upon a time', max_tokens: 12, temperature: 0 };
    const r = await client.completions.create(req);
    assert.equal(r.object, 'text_completion');
    let text = '';
    for await (const chunk of await client.completions.create({ ...req, stream: true })) text += chunk.choices[0]?.text ?? '';
    assert.equal(text, r.choices[0].text);
  });

  await check('a wrong key is AuthenticationError (401)', async () => {
    const bad = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0, timeout: 15000 });
    await assert.rejects(bad.models.list(), (e) => e instanceof mod.AuthenticationError && e.status === 401);
  });

  await check('an unknown model is NotFoundError (404)', async () => {
    await assert.rejects(
      client.chat.completions.create({ ...chat, model: 'no-such-model' }),
      (e) => e instanceof mod.NotFoundError && e.status === 404 && e.code === 'model_not_found',
    );
  });

  await check('a disconnect mid-stream cancels the generation, and the server goes on', async () => {
    const ac = new AbortController();
    const s = await client.completions.create(
      { model, prompt: 'Once upon a time', max_tokens: 400, stream: true, ignore_eos: true },
      { signal: ac.signal },
    );
    let chunks = 0;
    try {
      for await (const _ of s) {
        if (++chunks === 2) {
          ac.abort();
          break;
        }
      }
    } catch (e) {
      if (!(e instanceof mod.APIUserAbortError || e.name === 'AbortError')) throw e;
    }
    assert.equal(chunks, 2);
    const metrics = baseURL.replace(/\/v1\/?$/, '') + '/metrics';
    const cancelled = async () => {
      const r = await fetch(metrics, { headers: { Authorization: `Bearer ${apiKey}` } });
      const m = /^ebb_requests_total\{outcome="cancelled"\} (\S+)$/m.exec(await r.text());
      return m ? Number(m[1]) : 0;
    };
    const end = Date.now() + 5000;
    while ((await cancelled()) < 1 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    assert.ok((await cancelled()) >= 1, 'the server did not cancel the abandoned generation');
    const r = await client.chat.completions.create(chat);
    assert.equal(r.choices[0].message.content, plain.choices[0].message.content);
  });
}

main().then(
  () => console.log('openai client: all checks passed'),
  (e) => {
    console.error(`openai client: FAILED: ${e.stack ?? e}`);
    process.exit(1);
  },
);

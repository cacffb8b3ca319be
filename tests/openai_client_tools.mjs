// Drives a running `ebb serve` that has a chat template (test_serve_tools.cpp
// starts it with Qwen3's) with the official `openai` npm client: a forced
// tool call, the same call streamed (the client's own accumulation of
// tool_call deltas), a tool result sent back, and a json_schema response.
//
//   node tests/openai_client_tools.mjs BASE_URL API_KEY MODEL NPM_PREFIX
//
// Prints one line per check and "openai client tools: all checks passed";
// any failure exits 1 with its reason.
import assert from 'node:assert/strict';
import { connect, check, schemaValidator } from './openai_client_common.mjs';

const { model, client, prefix } = connect('openai_client_tools.mjs');
const validate = schemaValidator(prefix);

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 8 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
        required: ['city', 'days'],
        additionalProperties: false,
      },
    },
  },
];

function checkArguments(text) {
  validate(tools[0].function.parameters, JSON.parse(text));
}

// Every feature of the JSON Schema compiler at once, bounded so that even
// random weights finish: nested objects, $defs/$ref, enum, const, integer
// and number bounds, arrays with minItems/maxItems, anyOf, a simple
// pattern, optional properties.
const richSchema = {
  type: 'object',
  $defs: { item: { type: 'object', properties: { sku: { type: 'string', pattern: '^[A-Z]{2}[0-9]{2}$' },
    qty: { type: 'integer', minimum: 1, maximum: 9 } }, required: ['sku', 'qty'], additionalProperties: false } },
  properties: {
    kind: { enum: ['order', 'refund'] },
    version: { const: 2 },
    items: { type: 'array', items: { $ref: '#/$defs/item' }, minItems: 1, maxItems: 2 },
    note: { anyOf: [{ type: 'string', maxLength: 6 }, { type: 'null' }] },
    score: { type: 'number', minimum: 0 },
    flag: { type: 'boolean' },
  },
  required: ['kind', 'version', 'items', 'note'],
  additionalProperties: false,
};

async function main() {
  const req = {
    model,
    messages: [{ role: 'user', content: 'What is the weather in Oslo?' }],
    tools,
    tool_choice: 'required',
    parallel_tool_calls: false,
    max_tokens: 200,
    temperature: 0,
  };
  let whole;
  await check('a required tool call', async () => {
    const r = await client.chat.completions.create(req);
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.tool_calls.length, 1);
    assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
    checkArguments(c.message.tool_calls[0].function.arguments);
    whole = c.message;
  });

  await check('the same call streamed (client-side accumulation)', async () => {
    const runner = client.chat.completions.stream({ ...req, stream: true });
    const done = await runner.finalChatCompletion();
    const m = done.choices[0].message;
    assert.equal(done.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.tool_calls.length, 1);
    assert.equal(m.tool_calls[0].function.name, whole.tool_calls[0].function.name);
    assert.equal(m.tool_calls[0].function.arguments, whole.tool_calls[0].function.arguments);
  });

  await check('a tool result sent back', async () => {
    const r = await client.chat.completions.create({
      model,
      messages: [...req.messages, whole, { role: 'tool', tool_call_id: whole.tool_calls[0].id, content: 'Sunny' }],
      tools,
      max_tokens: 12,
      temperature: 0,
    });
    assert.equal(r.choices[0].message.role, 'assistant');
  });

  await check('a json_schema response', async () => {
    const r = await client.chat.completions.create({
      model,
      messages: [{ role: 'user', content: 'Answer in JSON.' }],
      response_format: {
        type: 'json_schema',
        json_schema: {
          name: 'answer',
          strict: true,
          schema: {
            type: 'object',
            properties: { answer: { type: 'string', maxLength: 10 } },
            required: ['answer'],
            additionalProperties: false,
          },
        },
      },
      max_tokens: 100,
      temperature: 0,
    });
    const a = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof a.answer, 'string');
    validate({ type: 'object', properties: { answer: { type: 'string', maxLength: 10 } }, required: ['answer'],
      additionalProperties: false }, a);
  });

  await check('json_schema output validates against a schema with every compiled feature (3 seeds)', async () => {
    for (const seed of [1, 2, 3]) {
      const r = await client.chat.completions.create({
        model,
        messages: [{ role: 'user', content: 'An order, as JSON.' }],
        response_format: { type: 'json_schema', json_schema: { name: 'order', strict: true, schema: richSchema } },
        max_tokens: 400,
        temperature: 1,
        seed,
      });
      assert.equal(r.choices[0].finish_reason, 'stop', JSON.stringify(r.choices[0]));
      validate(richSchema, JSON.parse(r.choices[0].message.content));
    }
  });
}

main().then(
  () => console.log('openai client tools: all checks passed'),
  (e) => {
    console.error(`openai client tools: FAILED: ${e.stack ?? e}`);
    process.exit(1);
  },
);

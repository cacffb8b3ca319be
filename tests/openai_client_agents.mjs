// The learning loop end to end through the official `openai` npm client
// (test_serve_agents.cpp starts `ebb serve --learn` on stories260K and runs
// this script): an agent tells stories; its user answers each one that names
// Lily with the correction "call her Zorba, not Lily" (POST /v1/feedback);
// the server learns while it serves, and after a bounded number of feedback
// turns at least half of the agent's stories name Zorba (none before).
//
//   node tests/openai_client_agents.mjs BASE_URL API_KEY MODEL NPM_PREFIX
import assert from 'node:assert/strict';
import { connect, check } from './openai_client_common.mjs';

const { baseURL, apiKey, model, client } = connect('openai_client_agents.mjs');
const agentModel = `${model}:agent/teller`;
const kMaxFeedback = 20;  // the bound on feedback turns
const kEvalStories = 10;

async function api(method, path, body) {
  const r = await fetch(`${baseURL}${path}`, {
    method,
    headers: { 'Authorization': `Bearer ${apiKey}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const j = await r.json();
  assert.equal(r.status, 200, `${method} ${path}: ${r.status} ${JSON.stringify(j)}`);
  return j;
}

async function tell(seed) {
  const r = await client.completions.create({ model: agentModel, prompt: 'Once upon a time', max_tokens: 40, seed });
  return { id: r.id, text: r.choices[0].text };
}

// Stories of fixed seeds (the same before and after) that name Zorba.
async function zorbaShare() {
  let n = 0;
  for (let i = 0; i < kEvalStories; ++i) if ((await tell(1000 + i)).text.includes('Zorba')) ++n;
  return n / kEvalStories;
}

// Until no learning round runs or waits to start.
async function settled() {
  const end = Date.now() + 20000;
  for (;;) {
    const l = await api('GET', '/learning');
    const a = l.agents.teller;
    const busy = l.gates_pending > 0 ||
                 (a && (a.new_samples >= 4 || (a.round && (a.round.state === 'queued' || a.round.state === 'running'))));
    if (!busy) return l;
    assert.ok(Date.now() < end, `learning did not settle: ${JSON.stringify(l)}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

async function main() {
  await check('a learning agent', async () => {
    const a = await api('POST', '/agents', { name: 'teller', role: 'storyteller', adapter: 'teller-names', learn: true });
    assert.equal(a.adapter_policy, 'follow_published');
  });
  let before;
  await check('no story names Zorba before', async () => {
    before = await zorbaShare();
    assert.equal(before, 0);
  });
  let feedback = 0, share = 0, seed = 1;
  while (feedback < kMaxFeedback && share < 0.5) {
    // A turn of up to 8 stories, at most 4 of them corrected.
    for (let k = 0, told = 0; k < 4 && told < 8 && feedback < kMaxFeedback; ++seed, ++told) {
      const s = await tell(seed);
      if (!s.text.includes('Lily')) continue;  // the user corrects Lily only
      const f = await api('POST', '/feedback', { id: s.id, correction: 'call her Zorba, not Lily' });
      assert.equal(f.applied, true, JSON.stringify(f));
      ++feedback;
      ++k;
    }
    const l = await settled();
    share = await zorbaShare();
    console.log(`after ${feedback} feedback turns: ${l.train_steps} steps, ${l.committed_versions} committed, ` +
                `${l.published_versions} published; ${share * 100}% of stories name Zorba`);
  }
  await check(`learned: ${share * 100}% of stories name Zorba after ${feedback} feedback turns (0% before)`, async () => {
    assert.ok(share >= 0.5, `only ${share * 100}%`);
    const l = await api('GET', '/learning');
    assert.ok(l.published['teller-names'] >= 1, JSON.stringify(l));
    assert.ok(l.versions.some((v) => v.gate === 'passed'), JSON.stringify(l.versions));
  });
}

main().catch((e) => {
  console.error(`openai client (agents): ${e.stack ?? e}`);
  process.exit(1);
});

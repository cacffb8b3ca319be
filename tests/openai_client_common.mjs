// What the scripts that drive `ebb serve` with the official `openai` npm
// client share (openai_client.mjs, openai_client_tools.mjs): their
// arguments, the package loaded from where scripts/setup.sh installed it,
// a client, and one printed line per check.
//
//   node tests/SCRIPT.mjs BASE_URL API_KEY MODEL NPM_PREFIX
import { createRequire } from 'node:module';
import { join } from 'node:path';

export function connect(script) {
  const [baseURL, apiKey, model, prefix] = process.argv.slice(2);
  if (!baseURL || !apiKey || !model || !prefix) {
    console.error(`usage: node ${script} BASE_URL API_KEY MODEL NPM_PREFIX`);
    process.exit(2);
  }
  let mod;
  try {
    mod = createRequire(join(prefix, 'package.json'))('openai');
  } catch (e) {
    console.error(`the openai package is not installed under ${prefix} (run scripts/setup.sh): ${e.message}`);
    process.exit(1);
  }
  const OpenAI = mod.OpenAI ?? mod.default ?? mod;
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 15000 });
  return { baseURL, apiKey, model, mod, OpenAI, client, prefix };
}

// A JSON Schema validator (ajv, installed beside the client by
// scripts/setup.sh): validate(schema, value) throws naming what failed.
export function schemaValidator(prefix) {
  let Ajv;
  try {
    const m = createRequire(join(prefix, 'package.json'))('ajv');
    Ajv = m.default ?? m.Ajv ?? m;
  } catch (e) {
    console.error(`the ajv package is not installed under ${prefix} (run scripts/setup.sh): ${e.message}`);
    process.exit(1);
  }
  const ajv = new Ajv({ allErrors: true, strict: false });
  return (schema, value) => {
    const ok = ajv.validate(schema, value);
    if (!ok) throw new Error(`${JSON.stringify(value)} does not match its schema: ${ajv.errorsText(ajv.errors)}`);
  };
}

export async function check(name, fn) {
  await fn();
  console.log(`ok: ${name}`);
}

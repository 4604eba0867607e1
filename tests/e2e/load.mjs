// Bounded load test: C concurrent streaming clients for D seconds (LOAD_CLIENTS, LOAD_SECONDS; 64
// and 60 for the record, shorter in CI). Fails on any error, on a stream without [DONE]/usage, or if
// /metrics reports leaked KV blocks or requests still running afterwards. Prints one JSON line and,
// with LOAD_RESULT=path, writes it there together with LOAD_META (a JSON object from the script that
// started the server: engine, command, commit, machine) — every field of the result file is written
// here, none by hand. Plain fetch + SSE parsing (node alone, no SDK): the official SDK's behaviour is
// openai.test.mjs's subject, throughput is this file's.
import fs from 'node:fs';

const BASE = process.env.TANDEM_BASE_URL ?? 'http://127.0.0.1:8000';
const API_KEY = process.env.TANDEM_API_KEY ?? 'none';
const MODEL = process.env.TANDEM_MODEL_NAME ?? 'tandem';
if (!['127.0.0.1', 'localhost'].includes(new URL(BASE).hostname)) throw new Error('load test talks to loopback only');

const clients = Number(process.env.LOAD_CLIENTS ?? 64);
const seconds = Number(process.env.LOAD_SECONDS ?? 10);
const maxTokens = Number(process.env.LOAD_MAX_TOKENS ?? 64);
const deadline = Date.now() + seconds * 1000;
let requests = 0, errors = 0, tokens = 0;
const ttfts = [];
const errorSamples = [];

async function metrics() {
  return await (await fetch(`${BASE}/metrics`)).text();
}
// Sum over all label sets of a metric (one engine: one series, except per-position counters).
function metricValue(text, name) {
  let sum = NaN;
  for (const line of text.split('\n')) {
    if (line.startsWith(name + '{') || line.startsWith(name + ' ')) sum = (Number.isNaN(sum) ? 0 : sum) + Number(line.split(' ').pop());
  }
  return sum;
}

// One streaming chat completion; returns { first, usage } or throws.
async function streamOnce(content, t0) {
  const r = await fetch(`${BASE}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}` },
    body: JSON.stringify({ model: MODEL, stream: true, stream_options: { include_usage: true }, max_tokens: maxTokens,
      messages: [{ role: 'user', content }] }),
  });
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${(await r.text()).slice(0, 200)}`);
  const dec = new TextDecoder();
  let buf = '', first = 0, usage = null, done = false;
  for await (const part of r.body) {
    buf += dec.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, i);
      buf = buf.slice(i + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') { done = true; continue; }
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(`stream error: ${JSON.stringify(chunk.error).slice(0, 200)}`);
        if (!first && chunk.choices?.[0]?.delta?.content) first = performance.now();
        if (chunk.usage) usage = chunk.usage;
      }
    }
  }
  if (!done) throw new Error('stream ended without [DONE]');
  if (!usage) throw new Error('stream ended without usage');
  return { first: first ? (first - t0) / 1000 : 0, usage };
}

async function worker(id) {
  let i = 0;
  while (Date.now() < deadline) {
    const t0 = performance.now();
    try {
      const { first, usage } = await streamOnce(`client ${id} request ${i++}: tell me something`, t0);
      requests++;
      tokens += usage.completion_tokens;
      if (first) ttfts.push(first);
    } catch (e) {
      errors++;
      if (errorSamples.length < 5) errorSamples.push(String(e?.message ?? e));
    }
  }
}

const specNames = { drafts: 'vllm:spec_decode_num_drafts_total', draft_tokens: 'vllm:spec_decode_num_draft_tokens_total',
  accepted_tokens: 'vllm:spec_decode_num_accepted_tokens_total' };
const m0 = await metrics();
const t0 = Date.now();
await Promise.all(Array.from({ length: clients }, (_, i) => worker(i)));
const wall = (Date.now() - t0) / 1000;
let m = await metrics();
for (let i = 0; i < 50 && metricValue(m, 'vllm:num_requests_running') > 0; i++) {
  await new Promise((r) => setTimeout(r, 100));
  m = await metrics();
}
const health = (await fetch(`${BASE}/health`)).status;
ttfts.sort((a, b) => a - b);
const spec = {};
for (const [k, n] of Object.entries(specNames)) {
  const v = metricValue(m, n) - metricValue(m0, n);
  if (!Number.isNaN(v)) spec[k] = v;
}
const result = {
  date: new Date().toISOString(), clients, seconds, wall_s: wall, max_tokens_per_request: maxTokens, requests, errors,
  completion_tokens: tokens, tokens_per_s: tokens / wall, requests_per_s: requests / wall,
  ttft_p50_s: ttfts[Math.floor(ttfts.length * 0.5)] ?? null, ttft_p99_s: ttfts[Math.floor(ttfts.length * 0.99)] ?? null,
  kv_blocks_leaked: metricValue(m, 'tandem:kv_blocks_leaked'), running_after: metricValue(m, 'vllm:num_requests_running'),
  health_after: health, spec_decode: spec, error_samples: errorSamples,
  ...(process.env.LOAD_META ? JSON.parse(process.env.LOAD_META) : {}),
};
console.log(JSON.stringify(result));
if (process.env.LOAD_RESULT) fs.writeFileSync(process.env.LOAD_RESULT, JSON.stringify(result, null, 2) + '\n');
const ok = errors === 0 && requests > 0 && result.kv_blocks_leaked === 0 && result.running_after === 0 && health === 200;
process.exit(ok ? 0 : 1);

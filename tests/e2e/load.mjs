// Bounded load test: C concurrent streaming clients for D seconds (LOAD_CLIENTS, LOAD_SECONDS; 64
// and 60 for the record, shorter in CI). Fails on any error, on a stream without [DONE]/usage, or if
// /metrics reports leaked KV blocks or requests still running afterwards. Prints one JSON line and,
// with LOAD_RESULT=path, writes it there.
import fs from 'node:fs';
import { client, metrics, metricValue, MODEL } from './common.mjs';

const clients = Number(process.env.LOAD_CLIENTS ?? 64);
const seconds = Number(process.env.LOAD_SECONDS ?? 10);
const maxTokens = Number(process.env.LOAD_MAX_TOKENS ?? 64);
const ai = client();
const deadline = Date.now() + seconds * 1000;
let requests = 0, errors = 0, tokens = 0;
const ttfts = [];
const errorSamples = [];

async function worker(id) {
  let i = 0;
  while (Date.now() < deadline) {
    const t0 = performance.now();
    let first = 0, usage = null;
    try {
      const stream = await ai.chat.completions.create({
        model: MODEL, stream: true, stream_options: { include_usage: true }, max_tokens: maxTokens,
        messages: [{ role: 'user', content: `client ${id} request ${i++}: tell me something` }],
      });
      for await (const chunk of stream) {
        if (!first && chunk.choices[0]?.delta?.content) first = performance.now();
        if (chunk.usage) usage = chunk.usage;
      }
      if (!usage) throw new Error('stream ended without usage');
      requests++;
      tokens += usage.completion_tokens;
      if (first) ttfts.push((first - t0) / 1000);
    } catch (e) {
      errors++;
      if (errorSamples.length < 5) errorSamples.push(String(e?.message ?? e));
    }
  }
}

const t0 = Date.now();
await Promise.all(Array.from({ length: clients }, (_, i) => worker(i)));
const wall = (Date.now() - t0) / 1000;
let m = await metrics();
for (let i = 0; i < 50 && metricValue(m, 'vllm:num_requests_running') > 0; i++) {
  await new Promise((r) => setTimeout(r, 100));
  m = await metrics();
}
ttfts.sort((a, b) => a - b);
const result = {
  date: new Date().toISOString(), clients, seconds, wall_s: wall, requests, errors, completion_tokens: tokens,
  tokens_per_s: tokens / wall, requests_per_s: requests / wall,
  ttft_p50_s: ttfts[Math.floor(ttfts.length * 0.5)] ?? null, ttft_p99_s: ttfts[Math.floor(ttfts.length * 0.99)] ?? null,
  kv_blocks_leaked: metricValue(m, 'tandem:kv_blocks_leaked'), running_after: metricValue(m, 'vllm:num_requests_running'),
  error_samples: errorSamples,
};
console.log(JSON.stringify(result));
if (process.env.LOAD_RESULT) fs.writeFileSync(process.env.LOAD_RESULT, JSON.stringify(result, null, 2) + '\n');
const ok = errors === 0 && requests > 0 && result.kv_blocks_leaked === 0 && result.running_after === 0;
process.exit(ok ? 0 : 1);

// Raw sockets against tandem serve: malformed HTTP, slow writers, slow readers, and a client that
// vanishes mid-stream (its request must be cancelled: running requests return to 0).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { BASE, MODEL, API_KEY, metrics, metricValue } from './common.mjs';

const { hostname, port } = new URL(BASE);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function exchange(chunks, { delayMs = 0, readMs = 3000 } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(Number(port), hostname);
    let data = '';
    s.on('data', (d) => { data += d.toString('latin1'); });
    s.on('error', () => {});
    s.on('close', () => resolve(data));
    s.on('connect', async () => {
      for (const c of chunks) {
        s.write(c);
        if (delayMs) await sleep(delayMs);
      }
      setTimeout(() => s.destroy(), readMs);
    });
  });
}

async function healthy() {
  const r = await fetch(`${BASE}/health`);
  return r.status === 200;
}

function chatRequest(body) {
  const b = JSON.stringify(body);
  return `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${API_KEY}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(b)}\r\nConnection: close\r\n\r\n${b}`;
}

test('malformed HTTP gets an error or a close, never a crash', async () => {
  const cases = [
    'GARBAGE\r\n\r\n',
    'POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n',
    'POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\n{"a":',
    'POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\n',
    'POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 20\r\n\r\n\x00\xff\xfe{{{{[[[[\x01',
    'GET /' + 'a'.repeat(20000) + ' HTTP/1.1\r\n\r\n',
    'GET /health HTTP/1.1\r\n' + 'X-A: b\r\n'.repeat(2000) + '\r\n',
  ];
  for (const c of cases) {
    const out = await exchange([c], { readMs: 500 });
    if (out.length) assert.match(out, /^HTTP\/1\.1 \d\d\d/, JSON.stringify(c.slice(0, 40)));
  }
  assert.ok(await healthy());
});

test('slow writer (body trickled byte by byte) still gets its answer', async () => {
  const req = chatRequest({ model: MODEL, messages: [{ role: 'user', content: 'slow' }], max_tokens: 4 });
  const parts = [req.slice(0, 40), ...req.slice(40).match(/.{1,16}/gs)];
  const out = await exchange(parts, { delayMs: 20, readMs: 8000 });
  assert.match(out, /^HTTP\/1\.1 200/);
  assert.match(out, /chat\.completion/);
});

test('slow reader receives the whole stream', async () => {
  const req = chatRequest({ model: MODEL, messages: [{ role: 'user', content: 'read me slowly' }], max_tokens: 48, stream: true });
  const out = await new Promise((resolve) => {
    const s = net.connect(Number(port), hostname);
    let data = '';
    s.on('data', (d) => { data += d.toString(); s.pause(); setTimeout(() => s.resume(), 30); });
    s.on('end', () => resolve(data));
    s.on('error', () => resolve(data));
    s.write(req);
  });
  assert.match(out, /data: \[DONE\]/);
});

test('client disconnect mid-stream cancels the request', async () => {
  const before = metricValue(await metrics(), 'vllm:num_requests_running');
  const req = chatRequest({ model: MODEL, messages: [{ role: 'user', content: 'long story' }], max_tokens: 1000, ignore_eos: true, stream: true });
  await new Promise((resolve) => {
    const s = net.connect(Number(port), hostname);
    s.on('data', () => { s.destroy(); resolve(); });
    s.on('error', resolve);
    s.write(req);
  });
  let running = NaN;
  for (let i = 0; i < 100; i++) {
    running = metricValue(await metrics(), 'vllm:num_requests_running');
    if (running <= before) break;
    await sleep(50);
  }
  assert.ok(running <= before, `running ${running} after disconnect (before ${before})`);
  assert.equal(metricValue(await metrics(), 'tandem:kv_blocks_leaked'), 0);
  assert.ok(await healthy());
});

test('client disconnect during a non-streaming request cancels it within 2 s', async () => {
  const before = metricValue(await metrics(), 'vllm:num_requests_running');
  // Thousands of tokens: the echo engine would run for several seconds more if nobody noticed.
  const maxTokens = Math.min(3500, Number(process.env.TANDEM_MAX_MODEL_LEN || 4096) - 200);
  const req = chatRequest({ model: MODEL, messages: [{ role: 'user', content: 'long story' }], max_tokens: maxTokens, ignore_eos: true });
  const s = net.connect(Number(port), hostname);
  s.on('error', () => {});
  s.write(req);
  let running = NaN;
  for (let i = 0; i < 200; i++) {
    running = metricValue(await metrics(), 'vllm:num_requests_running');
    if (running > before) break;
    await sleep(10);
  }
  assert.ok(running > before, 'the request never started');
  s.destroy();
  const t0 = Date.now();
  for (let i = 0; i < 40; i++) {
    running = metricValue(await metrics(), 'vllm:num_requests_running');
    if (running <= before) break;
    await sleep(50);
  }
  assert.ok(running <= before, `running ${running} ${Date.now() - t0} ms after the disconnect (before ${before})`);
  assert.equal(metricValue(await metrics(), 'tandem:kv_blocks_leaked'), 0);
  assert.ok(await healthy());
});

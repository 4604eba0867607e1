// Shared settings of the e2e tests: where the server is (set by tools/e2e.sh) and whether it runs the
// built-in EchoEngine (exact replies can be asserted) or a real model (shape-only assertions).
import OpenAI from 'openai';

export const BASE = process.env.TANDEM_BASE_URL ?? 'http://127.0.0.1:8000';
export const API_KEY = process.env.TANDEM_API_KEY ?? 'none';
export const MODEL = process.env.TANDEM_MODEL_NAME ?? 'tandem';
export const ECHO = process.env.TANDEM_E2E_ECHO === '1';
export const MAX_MODEL_LEN = Number(process.env.TANDEM_MAX_MODEL_LEN ?? '4096');

const url = new URL(BASE);
if (url.hostname !== '127.0.0.1' && url.hostname !== 'localhost') {
  throw new Error(`e2e tests only talk to loopback, not ${url.hostname}`);
}

export function client(apiKey = API_KEY) {
  return new OpenAI({ baseURL: `${BASE}/v1`, apiKey, maxRetries: 0, timeout: Number(process.env.TANDEM_E2E_TIMEOUT_S ?? 600) * 1000 });
}

export async function metrics() {
  const r = await fetch(`${BASE}/metrics`);
  return await r.text();
}

export function metricValue(text, name) {
  for (const line of text.split('\n')) {
    if (line.startsWith(name + '{') || line.startsWith(name + ' ')) return Number(line.split(' ').pop());
  }
  return NaN;
}

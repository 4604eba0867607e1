// The official OpenAI SDK against tandem serve: chat, streaming with usage, tool-call round trip,
// strict json_schema checked by a real validator (ajv), completions, and every error case.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import OpenAI from 'openai';
import { client, MODEL, ECHO, MAX_MODEL_LEN } from './common.mjs';

const ai = client();

test('models lists the served name', async () => {
  const list = await ai.models.list();
  const ids = list.data.map((m) => m.id);
  assert.ok(ids.includes(MODEL), `models: ${ids}`);
});

test('chat completion with usage', async () => {
  const r = await ai.chat.completions.create({
    model: MODEL,
    messages: [{ role: 'user', content: 'Say hello.' }],
    max_tokens: 32,
    temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  if (ECHO) assert.equal(r.choices[0].message.content, 'Echo: Say hello.');
  const u = r.usage;
  assert.ok(u.prompt_tokens > 0);
  assert.ok(u.completion_tokens > 0);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.equal(typeof u.prompt_tokens_details.cached_tokens, 'number');
  assert.equal(typeof u.completion_tokens_details.reasoning_tokens, 'number');
});

test('streaming chat with include_usage', async () => {
  const stream = await ai.chat.completions.create({
    model: MODEL,
    messages: [{ role: 'user', content: 'Count to three.' }],
    max_tokens: 32,
    stream: true,
    stream_options: { include_usage: true },
  });
  let content = '';
  let finish = null;
  let usage = null;
  let sawRole = false;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    const c = chunk.choices[0];
    if (c.delta.role) sawRole = true;
    if (c.delta.content) content += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.ok(sawRole);
  assert.ok(finish === 'stop' || finish === 'length');
  assert.ok(usage, 'final usage chunk');
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  if (ECHO) assert.equal(content, 'Echo: Count to three.');
  // The SDK's helper reassembles the same stream into a final completion.
  const runner = ai.beta.chat.completions.stream({
    model: MODEL, messages: [{ role: 'user', content: 'again' }], max_tokens: 16,
  });
  const final = await runner.finalChatCompletion();
  assert.equal(typeof final.choices[0].message.content, 'string');
});

test('reasoning content in thinking mode', async () => {
  const r = await ai.chat.completions.create({
    model: MODEL,
    messages: [{ role: 'user', content: 'Think first.' }],
    max_tokens: 64,
    chat_template_kwargs: { thinking: true },
  });
  const m = r.choices[0].message;
  assert.ok(typeof m.reasoning_content === 'string' || m.reasoning_content === null);
  if (ECHO) {
    assert.equal(m.reasoning_content, 'Thinking about: Think first.');
    assert.equal(m.content, 'Echo: Think first.');
    assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
  }
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 40 }, unit: { enum: ['C', 'F'] } },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};

// A random-weight checkpoint (make-tiny) may spend any max_tokens inside a forced call's JSON (the
// grammar allows whitespace and, with tool_choice "required", further calls): with a real model it
// runs one request; otherwise it tries further seeds until a reply finishes (each one cut by
// max_tokens must still be a well-formed reply).
const SEED_TRIES = ECHO ? 1 : 16;

test('tool call round trip (forced tool, streamed and not)', async () => {
  const ajv = new Ajv();
  const validArgs = ajv.compile(weatherTool.function.parameters);
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  let r;
  for (let i = 0; i < SEED_TRIES; i++) {
    r = await ai.chat.completions.create({
      model: MODEL, messages, tools: [weatherTool], tool_choice: 'required', max_tokens: 200, seed: 3 + 100 * i,
    });
    if (r.choices[0].finish_reason !== 'length') break;
    assert.equal(r.choices[0].message.role, 'assistant');
  }
  const msg = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.ok(msg.tool_calls.length >= 1);
  const call = msg.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.ok(call.id.startsWith('call_'));
  const args = JSON.parse(call.function.arguments);
  assert.ok(validArgs(args), JSON.stringify(validArgs.errors));

  // Named tool, streamed: id/name first, then argument fragments.
  let name = null;
  let streamedArgs = '';
  let finish = null;
  for (let i = 0; i < SEED_TRIES && finish !== 'tool_calls'; i++) {
    const stream = await ai.chat.completions.create({
      model: MODEL, messages, tools: [weatherTool], max_tokens: 200, seed: 4 + 100 * i, stream: true,
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
    });
    name = null;
    streamedArgs = '';
    finish = null;
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      if (c.finish_reason) finish = c.finish_reason;
      for (const tc of c.delta.tool_calls ?? []) {
        assert.equal(tc.index, 0);
        if (tc.function?.name) name = tc.function.name;
        streamedArgs += tc.function?.arguments ?? '';
      }
    }
    assert.ok(finish === 'tool_calls' || finish === 'length', finish);
  }
  assert.equal(name, 'get_weather');
  assert.equal(finish, 'tool_calls');
  assert.ok(validArgs(JSON.parse(streamedArgs)));

  // Send the result back; the model answers in text.
  messages.push(msg);
  messages.push({ role: 'tool', tool_call_id: call.id, content: 'sunny, 21 C' });
  const r2 = await ai.chat.completions.create({ model: MODEL, messages, tools: [weatherTool], max_tokens: 64 });
  assert.equal(typeof r2.choices[0].message.content, 'string');
  if (ECHO) assert.ok(r2.choices[0].message.content.includes('sunny, 21 C'));
});

if (ECHO) {
  test('model-emitted DSML tool calls are parsed (echo engine)', async () => {
    const r = await ai.chat.completions.create({
      model: MODEL, tools: [weatherTool],
      messages: [{ role: 'user', content: 'call get_weather {"city": "Oslo", "unit": "C"}' }],
    });
    const tc = r.choices[0].message.tool_calls;
    assert.equal(tc.length, 1);
    assert.deepEqual(JSON.parse(tc[0].function.arguments), { city: 'Oslo', unit: 'C' });
  });
}

test('strict json_schema output validates with ajv', async () => {
  const schema = {
    type: 'object',
    properties: {
      title: { type: 'string', maxLength: 30 },
      year: { type: 'integer' },
      rating: { type: 'number' },
      genres: { type: 'array', items: { enum: ['drama', 'comedy', 'sci-fi'] }, maxItems: 3 },
      sequel: { anyOf: [{ type: 'null' }, { $ref: '#/$defs/film' }] },
    },
    required: ['title', 'year', 'rating', 'genres', 'sequel'],
    additionalProperties: false,
    $defs: { film: { type: 'object', properties: { title: { type: 'string', maxLength: 20 } }, required: ['title'], additionalProperties: false } },
  };
  const validate = new Ajv().compile(schema);
  for (let seed = 0; seed < 4; seed++) {
    const r = await ai.chat.completions.create({
      model: MODEL, seed, max_tokens: 400,
      messages: [{ role: 'user', content: 'Describe a film as JSON.' }],
      response_format: { type: 'json_schema', json_schema: { name: 'film', strict: true, schema } },
    });
    assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
    const out = JSON.parse(r.choices[0].message.content);
    assert.ok(validate(out), `${JSON.stringify(validate.errors)} for ${r.choices[0].message.content}`);
  }
  const r = await ai.chat.completions.create({
    model: MODEL, max_tokens: 200, messages: [{ role: 'user', content: 'JSON please' }],
    response_format: { type: 'json_object' },
  });
  // A finished object parses; one cut by max_tokens (a random-weight model may keep a string open
  // for 200 tokens) must at least be an object's beginning.
  const content = r.choices[0].message.content;
  if (r.choices[0].finish_reason === 'stop') {
    const obj = JSON.parse(content);
    assert.equal(typeof obj, 'object');
    assert.ok(!Array.isArray(obj));
  } else {
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.ok(content.trimStart().startsWith('{'), content);
  }
});

test('completions endpoint, plain and streamed', async () => {
  const r = await ai.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 8 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(r.usage.completion_tokens <= 8);
  const stream = await ai.completions.create({ model: MODEL, prompt: 'abc', max_tokens: 5, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  if (ECHO) assert.equal(text, 'Echo:');
});

test('completions echo with logprobs scores the prompt (the loglikelihood request of lm-evaluation-harness)', async () => {
  const r = await ai.completions.create({ model: MODEL, prompt: 'The cat sat', max_tokens: 1, echo: true, logprobs: 1, temperature: 0 });
  const lp = r.choices[0].logprobs;
  assert.ok(r.choices[0].text.startsWith('The cat sat'), r.choices[0].text);
  const n = r.usage.prompt_tokens + r.usage.completion_tokens;
  assert.equal(lp.tokens.length, n);
  assert.equal(lp.token_logprobs.length, n);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  assert.equal(lp.text_offset[0], 0);
  for (let i = 1; i < n; ++i) {
    assert.equal(typeof lp.token_logprobs[i], 'number', `entry ${i}`);
    assert.ok(lp.token_logprobs[i] <= 0);
  }
  const only = await ai.completions.create({ model: MODEL, prompt: 'The cat sat', max_tokens: 0, echo: true, logprobs: 1 });
  assert.equal(only.choices[0].text, 'The cat sat');
  assert.equal(only.usage.completion_tokens, 0);
  assert.deepEqual(only.choices[0].logprobs.token_logprobs.slice(0, r.usage.prompt_tokens),
                   lp.token_logprobs.slice(0, r.usage.prompt_tokens));
});

test('completions with a batch of prompts', async () => {
  const r = await ai.completions.create({ model: MODEL, prompt: ['one', 'two three'], n: 2, max_tokens: 2, echo: true });
  assert.equal(r.choices.length, 4);
  const byIndex = [...r.choices].sort((a, b) => a.index - b.index);
  assert.ok(byIndex[0].text.startsWith('one') && byIndex[1].text.startsWith('one'));
  assert.ok(byIndex[2].text.startsWith('two three') && byIndex[3].text.startsWith('two three'));
});

test('n > 1 and logprobs', async () => {
  const r = await ai.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'hi' }], n: 2, max_tokens: 4, logprobs: true, top_logprobs: 2,
  });
  assert.equal(r.choices.length, 2);
  for (const c of r.choices) {
    assert.ok(c.logprobs.content.length > 0);
    assert.equal(c.logprobs.content[0].top_logprobs.length, 2);
  }
});

async function expectError(promise, Klass, status, check) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof Klass, `${e?.constructor?.name}: ${e?.message}`);
    assert.equal(e.status, status);
    assert.equal(typeof e.error?.message ?? e.message, 'string');
    if (check) check(e);
    return true;
  });
}

test('errors are OpenAI error objects', async () => {
  const msgs = [{ role: 'user', content: 'x' }];
  await expectError(ai.chat.completions.create({ model: 'no-such-model', messages: msgs }), OpenAI.NotFoundError, 404);
  await expectError(ai.chat.completions.create({ model: MODEL, messages: msgs, temperature: 7 }), OpenAI.BadRequestError, 400,
    (e) => assert.equal(e.param, 'temperature'));
  await expectError(ai.chat.completions.create({ model: MODEL, messages: [] }), OpenAI.BadRequestError, 400);
  await expectError(ai.chat.completions.create({
    model: MODEL, messages: msgs,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^a' } } },
  }), OpenAI.BadRequestError, 400, (e) => assert.match(e.message, /pattern/));
  const long = 'word '.repeat(MAX_MODEL_LEN + 10);
  await expectError(ai.completions.create({ model: MODEL, prompt: long }), OpenAI.BadRequestError, 400,
    (e) => assert.match(e.message, new RegExp(String(MAX_MODEL_LEN))));
  if (process.env.TANDEM_API_KEY) {
    await expectError(client('wrong-key').chat.completions.create({ model: MODEL, messages: msgs }), OpenAI.AuthenticationError, 401);
  }
});

// Parity vectors from the HF `tokenizers` library itself (its Node binding ships the same Rust
// core as the Python one: `npm install tokenizers` in tools/tokenizer/ or anywhere on NODE_PATH).
//   node make_parity_vectors.mjs vectors <tokenizer.json> <out.json> <name>
//       encode (add_special_tokens=false) + decode of a fixed, diverse text set and random texts;
//       decode (with and without skip_special) of random id sequences.
//   node make_parity_vectors.mjs hftrain <corpus.txt> <out tokenizer.json>
//       a BPE trained by HF's own trainer with the DeepSeek-V4 pre-tokenizer, plus added tokens
//       exercising lstrip / rstrip / single_word / normalized.
// tests/text/tokenizer_parity_test.cpp replays the vectors against tandem::Tokenizer.
import { createRequire } from 'module';
import fs from 'fs';
import crypto from 'crypto';
const require = createRequire(import.meta.url);
const { Tokenizer } = require('tokenizers');
const tokenizersVersion = require('tokenizers/package.json').version;

// Deterministic PRNG (mulberry32).
function rng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const FIXED = [
  '', 'Hello, world! 123\nsecond line', '你好，世界！ Καλημέρα κόσμε 🌍',
  // code
  'def f(x):\n    return x * 2  # double\n\n\nclass A:\n\tpass\n',
  'for (int i = 0; i < n; ++i) { a[i] += b[i]; }\n', 'x=>{return a&&b||c;}', '#include <vector>\n',
  'if __name__ == "__main__":\n    main()\n', '{"a": [1, 2.5, -3e10], "b": null, "c": "ü"}',
  '<div class="x">&nbsp;</div>\n', 'SELECT * FROM t WHERE id=42;', 'ls -la /usr/bin | grep "^d"',
  // whitespace
  'a  b   c    d', '   leading', 'trailing   ', '\t\tx', 'a\t\tb', '\r\n', 'x\r\n\r\ny', ' \n ',
  '\n\n\n', '  \n  \n', 'a \u00a0b', '\u3000x\u3000', 'a\u0085b', 'a\u2028b\u2029c', ' ', '  ',
  '\t', '\n', ' \t \n \r\n', 'word \n', 'word  \n\n  next', 'a\u000bb\u000cc', '\u2003em\u2009thin',
  // digits
  '1234567', '12 345 6789', '３４５６', '٣٤٥٦٧', 'Ⅻ Ⅳ', '½ ¾ ²³', 'x1y22z333w4444', '3.14159',
  '1,000,000', '-42', '0x1F', '2024-03-15T12:30:00Z', '99bottles', 'v1.2.3', '１２３abc',
  // CJK and kana
  '中文和English混合', 'abc中文def', 'カ・ナ', 'コーヒー', 'ゝゞ', 'ひらがなカタカナ漢字',
  '𠮷野家', '龦龥', '〇一二三', '「引用」『二重』', '日本語のテキスト。次の文！', '한국어 텍스트입니다',
  // emoji
  '👨‍👩‍👧‍👦', '👩🏽‍💻 coding', '🇯🇵🇺🇸', '❤️❤', '🏳️‍🌈', 'a😀b', '😀😀😀', '✨x✨',
  // combining marks
  'e\u0301', '\u0301abc', 'a\u0308\u0308', 'cafe\u0301 naïve', 'n\u0303o', ' \u0301', '\u0301\u0301',
  // punctuation runs and newlines
  'foo;\n', '>;\n\n', '!!!\r\n', '...\n\nx', '}}\n', ' ?!\n', '"quoted"', "it's", "don't",
  '(a)', '[b]', '--flag', '->', '::', '<<>>', '.hidden', '@user', '#tag', '$HOME', '%d', '^_^',
  '!Hello', '.Net', "'s", '"a"b', '``code``', '~~', '\\n', '\\\\', 'a/b/c', 'http://x.com/a?b=c&d=e',
  // "invalid-looking" and control
  '\ufffd', '\u0000', '\u0001\u0002\u007f', '\ufeffBOM', 'zero\u200bwidth', '\u200d', '\ufe0f',
  '\\xff\\xfe', '%FF%FE', '\u00ad', 'a\u0600b',
  // other scripts
  'Привет, мир!', 'مرحبا بالعالم', 'नमस्ते दुनिया', 'สวัสดีครับ', 'שָׁלוֹם', 'Ελληνικά', 'İstanbul',
  // very long words
  'a'.repeat(3000), 'ab'.repeat(1500), '😀'.repeat(300), '1'.repeat(1000), ' '.repeat(1000),
  '\n'.repeat(300), 'supercalifragilisticexpialidocious'.repeat(40), '中'.repeat(500),
  'x' + ' '.repeat(200) + 'y', '.'.repeat(500) + '\n', 'A'.repeat(100) + 'b'.repeat(100),
  'aGVsbG8gd29ybGQ'.repeat(50),
];

const POOLS = [
  'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ', '0123456789', '     \t\n\r',
  '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~', 'éèêëàâäôöûüçñßøåæÉÀ', '\u0300\u0301\u0308\u0303\u0327',
  '的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年龥龦', 'あいうえおかきくけこゝゞ゠ァアイウエオーヽヾ・',
  '한국어가나다', '😀😂🎉🚀🌍❤✨🔥🤖👍🏽🇯🇵', '\u200d\ufe0f\u200b\u00ad', '\u00a0\u2003\u3000\u0085\u2028\u000b',
  '０１２３４５６７８９½²Ⅻ٣', '∑∫≈≠≤≥±×÷→⇒∞', 'Привет мир', 'مرحبا', 'नमस्ते', 'ไทย',
];

function randomText(r, len) {
  let s = '';
  while ([...s].length < len) {
    const pool = [...POOLS[Math.floor(r() * POOLS.length)]];
    const run = 1 + Math.floor(r() * 6);
    for (let i = 0; i < run; i++) s += pool[Math.floor(r() * pool.length)];
  }
  return s;
}

async function vectors(tokPath, outPath, name) {
  const jsonText = fs.readFileSync(tokPath, 'utf8');
  const tok = Tokenizer.fromString(jsonText);
  const doc = JSON.parse(jsonText);
  const added = (doc.added_tokens || []).map((t) => t.content);
  const r = rng(20261129);
  const texts = [...FIXED];
  // Added tokens inline, alone, doubled, cut short, and glued to text and whitespace.
  for (const a of added.slice(0, 40).concat(added.filter((_, i) => i % 97 === 0))) {
    texts.push(a, `x${a}y`, ` ${a} `, `${a}${a}`, a.slice(0, -1), `\n${a}\n`);
  }
  const nRandom = Number(process.env.PARITY_RANDOM || 400);
  for (let i = 0; i < nRandom; i++) {
    let t = randomText(r, 1 + Math.floor(r() * 60));
    if (added.length && r() < 0.3) {
      const a = added[Math.floor(r() * added.length)];
      const cut = Math.floor(r() * t.length);
      t = t.slice(0, cut) + a + t.slice(cut);
    }
    texts.push(t);
  }
  for (let i = 0; i < 10; i++) texts.push(randomText(r, 3000));
  // PARITY_TEXT_FILES=a,b,c adds whole files (one-off checks on real documents).
  for (const f of (process.env.PARITY_TEXT_FILES || '').split(',').filter(Boolean)) {
    texts.push(fs.readFileSync(f, 'utf8'));
  }
  const encode = [];
  for (const text of texts) {
    // Lone surrogates from slicing an emoji are not valid text for HF (Python str would refuse to
    // encode them to UTF-8 too): skip those.
    if (/[\ud800-\udbff](?![\udc00-\udfff])|(^|[^\ud800-\udbff])[\udc00-\udfff]/.test(text)) continue;
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    const ids = enc.getIds();
    encode.push({ text, ids, decoded: await tok.decode(ids, false) });
  }
  const vocabSize = tok.getVocabSize(true);
  const decode = [];
  for (let i = 0; i < 300; i++) {
    const n = 1 + Math.floor(r() * 12);
    const ids = [];
    for (let k = 0; k < n; k++) {
      const u = r();
      // mostly single-byte tokens (ids 3..258 in these files: split UTF-8), some anything.
      ids.push(u < 0.5 ? 3 + Math.floor(r() * 256) : Math.floor(r() * vocabSize));
    }
    decode.push({ ids, text: await tok.decode(ids, false), text_skip_special: await tok.decode(ids, true) });
  }
  const out = {
    name, tokenizers: `tokenizers ${tokenizersVersion} (Node binding)`,
    tokenizer_sha256: crypto.createHash('sha256').update(fs.readFileSync(tokPath)).digest('hex'),
    vocab_size: vocabSize, encode, decode,
  };
  fs.writeFileSync(outPath, JSON.stringify(out) + '\n');
  console.log(`${name}: ${encode.length} encode, ${decode.length} decode vectors -> ${outPath}`);
}

function deepseekPreTokenizer(patterns) {
  return {
    type: 'Sequence',
    pretokenizers: patterns.map((p) => ({ type: 'Split', pattern: { Regex: p }, behavior: 'Isolated', invert: false }))
      .concat([{ type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }]),
  };
}

function hftrain(corpusPath, outPath, patternsFrom) {
  const patterns = JSON.parse(fs.readFileSync(patternsFrom, 'utf8')).pre_tokenizer.pretokenizers
    .filter((p) => p.type === 'Split').map((p) => p.pattern.Regex);
  const skeleton = {
    version: '1.0', truncation: null, padding: null, added_tokens: [],
    normalizer: null, pre_tokenizer: deepseekPreTokenizer(patterns), post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab: {}, merges: [] },
  };
  const tok = Tokenizer.fromString(JSON.stringify(skeleton));
  tok.train([corpusPath]);  // HF's default BpeTrainer: only bytes seen in the corpus, no min count
  tok.save(outPath, false);
  const doc = JSON.parse(fs.readFileSync(outPath, 'utf8'));
  let next = Math.max(...Object.values(doc.model.vocab)) + 1;
  const flags = [
    ['<|lstrip|>', { lstrip: true, special: true, normalized: false }],
    ['<|rstrip|>', { rstrip: true, special: false, normalized: false }],
    ['<|both|>', { lstrip: true, rstrip: true, normalized: true }],
    ['word', { single_word: true, normalized: false }],
    ['日本', { single_word: true, normalized: true }],
    ['abc', { normalized: false }], ['ab', { normalized: true }],
    ['<｜User｜>', { special: true, normalized: false }], ['<｜Use', { normalized: true }],
    ['Ġhello', { normalized: false }], ['a b', { normalized: false }], [' lead', { normalized: false }],
    ['<think>', { special: false, normalized: false }], ['</think>', { special: false, normalized: true }],
    ['<｜end▁of▁sentence｜>', { special: true, normalized: false }],
  ];
  doc.added_tokens = flags.map(([content, f]) => ({
    id: next++, content, single_word: !!f.single_word, lstrip: !!f.lstrip, rstrip: !!f.rstrip,
    normalized: f.normalized !== false, special: !!f.special,
  }));
  fs.writeFileSync(outPath, JSON.stringify(doc) + '\n');
  console.log(`hftrain: ${Object.keys(doc.model.vocab).length} vocab, ${doc.model.merges.length} merges -> ${outPath}`);
}

const [mode, ...args] = process.argv.slice(2);
if (mode === 'vectors') await vectors(args[0], args[1], args[2]);
else if (mode === 'hftrain') hftrain(args[0], args[1], args[2]);
else { console.error('usage: vectors <tokenizer.json> <out.json> <name> | hftrain <corpus> <out.json> <patterns-from.json>'); process.exit(2); }

// JSON-schema grammar: schemas compile (or fail naming the keyword), the matcher accepts exactly
// valid documents, token masks agree with the matcher on every token, and random walks through
// masked token streams always produce schema-valid JSON.
#include <gtest/gtest.h>

#include <random>

#include "text/json_schema_grammar.h"

namespace tandem::json_grammar {
namespace {

using json = nlohmann::json;

std::shared_ptr<const Grammar> must(const json& schema) {
  auto g = compile(schema);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return g.ok() ? *g : nullptr;
}

bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& doc) {
  Matcher m(g);
  return m.advance(doc) && m.is_complete();
}

// Minimal validator for the supported subset (the test's independent oracle).
bool validate(const json& v, const json& s, const json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    std::string r = s["$ref"];
    if (r == "#") return validate(v, root, root);
    auto slash = r.rfind('/');
    std::string sect = r.substr(2, slash - 2);
    return validate(v, root[sect][r.substr(slash + 1)], root);
  }
  if (s.contains("const")) return v == s["const"];
  if (s.contains("enum")) {
    for (const auto& e : s["enum"])
      if (v == e) return true;
    return false;
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (s.contains(key)) {
      for (const auto& a : s[key])
        if (validate(v, a, root)) return true;
      return false;
    }
  std::vector<std::string> types;
  if (s.contains("type")) {
    if (s["type"].is_string()) types.push_back(s["type"]);
    else for (const auto& t : s["type"]) types.push_back(t);
  } else if (s.contains("properties")) {
    types.push_back("object");
  } else {
    return true;
  }
  for (const auto& t : types) {
    if (t == "string" && v.is_string()) {
      // code points
      size_t n = 0;
      for (unsigned char c : v.get<std::string>()) n += (c & 0xC0) != 0x80;
      if (s.contains("minLength") && n < s["minLength"].get<size_t>()) continue;
      if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) continue;
      return true;
    }
    if (t == "integer" && v.is_number_integer()) return true;
    if (t == "number" && v.is_number()) return true;
    if (t == "boolean" && v.is_boolean()) return true;
    if (t == "null" && v.is_null()) return true;
    if (t == "array" && v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) continue;
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) continue;
      bool ok = true;
      if (s.contains("items"))
        for (const auto& x : v) ok = ok && validate(x, s["items"], root);
      if (ok) return true;
    }
    if (t == "object" && v.is_object()) {
      bool ok = true;
      json props = s.value("properties", json::object());
      for (const auto& r : s.value("required", json::array())) ok = ok && v.contains(r.get<std::string>());
      for (auto it = v.begin(); it != v.end() && ok; ++it) {
        if (props.contains(it.key())) ok = validate(it.value(), props[it.key()], root);
        else if (s.contains("additionalProperties")) {
          const json& ap = s["additionalProperties"];
          ok = ap.is_boolean() ? ap.get<bool>() : validate(it.value(), ap, root);
        } else {
          ok = props.empty();
        }
      }
      if (ok) return true;
    }
  }
  return false;
}

const json kPerson = {{"type", "object"},
                      {"properties", {{"name", {{"type", "string"}, {"minLength", 1}, {"maxLength", 8}}},
                                      {"age", {{"type", "integer"}}},
                                      {"score", {{"type", "number"}}},
                                      {"ok", {{"type", "boolean"}}},
                                      {"nick", {{"type", {"string", "null"}}}},
                                      {"kind", {{"enum", {"a", "bc", 1, 12, nullptr}}}},
                                      {"tags", {{"type", "array"}, {"items", {{"type", "string"}, {"maxLength", 3}}}, {"minItems", 1}, {"maxItems", 3}}}}},
                      {"required", {"name", "age", "tags"}},
                      {"additionalProperties", false}};

TEST(Grammar, AcceptsAndRejects) {
  auto g = must(kPerson);
  ASSERT_TRUE(g);
  EXPECT_TRUE(accepts(g, R"({"name":"bo","age":3,"tags":["x"]})"));
  EXPECT_TRUE(accepts(g, R"({ "tags" : [ "x" , "yz" ], "age": -0, "name": "é\u00e9\"", "kind": 12, "nick": null, "score": 1.5e-3, "ok": false })"));
  EXPECT_FALSE(accepts(g, R"({"name":"bo","age":3})"));                    // missing required
  EXPECT_FALSE(accepts(g, R"({"name":"bo","age":3,"tags":["x"],"x":1})"));  // additional
  EXPECT_FALSE(accepts(g, R"({"name":"bo","age":3.5,"tags":["x"]})"));      // integer
  EXPECT_FALSE(accepts(g, R"({"name":"","age":3,"tags":["x"]})"));          // minLength
  EXPECT_FALSE(accepts(g, R"({"name":"123456789","age":3,"tags":["x"]})")); // maxLength
  EXPECT_FALSE(accepts(g, R"({"name":"a","age":3,"tags":[]})"));            // minItems
  EXPECT_FALSE(accepts(g, R"({"name":"a","age":3,"tags":["a","b","c","d"]})"));
  EXPECT_FALSE(accepts(g, R"({"name":"a","name":"b","age":3,"tags":["x"]})"));  // duplicate key
  EXPECT_FALSE(accepts(g, R"({"name":"a","age":3,"tags":["x"],"kind":2})"));    // enum
  EXPECT_FALSE(accepts(g, R"({"name":"a","age":03,"tags":["x"]})"));            // leading zero
  EXPECT_FALSE(accepts(g, R"( {"name":"a","age":3,"tags":["x"]})"));           // leading ws at root
  EXPECT_FALSE(accepts(g, R"({"name":"a","age":3,"tags":["x"]} )"));           // trailing
  Matcher m(g);
  EXPECT_TRUE(m.advance(R"({"name":"a")"));
  EXPECT_FALSE(m.is_complete());
  EXPECT_FALSE(m.advance("}"));       // required missing: rejected, matcher unchanged
  EXPECT_TRUE(m.advance(R"(,"age":1)"));
}

TEST(Grammar, RefsDefsRecursionAnyOf) {
  json tree = {{"$defs", {{"node", {{"type", "object"},
                                    {"properties", {{"v", {{"type", "integer"}}}, {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}}}}},
                                    {"required", {"v"}},
                                    {"additionalProperties", false}}}}},
               {"$ref", "#/$defs/node"}};
  auto g = must(tree);
  EXPECT_TRUE(accepts(g, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(accepts(g, R"({"v":1,"kids":[{"w":2}]})"));
  auto any = must({{"anyOf", {{{"type", "integer"}}, {{"const", "x"}}, {{"type", "array"}, {"items", {{"type", "boolean"}}}}}}});
  EXPECT_TRUE(accepts(any, "12"));
  EXPECT_TRUE(accepts(any, "\"x\""));
  EXPECT_TRUE(accepts(any, "[true,false]"));
  EXPECT_FALSE(accepts(any, "\"y\""));
  EXPECT_TRUE(accepts(any_object(), R"({"a":[1,{"b":null}],"c":"d"})"));
  EXPECT_FALSE(accepts(any_object(), "[1]"));
}

// Refs that reach each other through anyOf/oneOf alone: the matcher expanded them forever (the server
// died of a stack overflow on {"$ref": "#"}). Alternatives are now flattened to the values they reach,
// so such a union means what it says, and one that reaches no value is a clear error. Recursion
// through an array or an object, and a $ref used twice, are unchanged.
TEST(Grammar, RefsThroughAlternativesAlone) {
  for (const json& s :
       {json{{"$ref", "#"}}, json{{"anyOf", {{{"$ref", "#"}}}}},
        json{{"$defs", {{"a", {{"$ref", "#/$defs/b"}}}, {"b", {{"oneOf", {{{"$ref", "#/$defs/a"}}}}}}}}, {"$ref", "#/$defs/a"}}}) {
    auto g = compile(s);
    ASSERT_FALSE(g.ok()) << s.dump();
    EXPECT_NE(g.status().message().find("matches no value"), std::string::npos) << g.status().message();
  }
  // A = integer | B, B = string | A: both are integer | string.
  const json defs = {{"A", {{"anyOf", {{{"type", "integer"}}, {{"$ref", "#/$defs/B"}}}}}},
                     {"B", {{"anyOf", {{{"type", "string"}}, {{"$ref", "#/$defs/A"}}}}}}};
  auto mutual = must({{"$defs", defs}, {"type", "array"}, {"items", {{"$ref", "#/$defs/B"}}}});
  EXPECT_TRUE(accepts(mutual, R"([1,"x",2])"));
  EXPECT_FALSE(accepts(mutual, "[true]"));
  auto self_or_int = must({{"anyOf", {{{"$ref", "#"}}, {{"type", "integer"}}}}});
  EXPECT_TRUE(accepts(self_or_int, "12"));
  EXPECT_FALSE(accepts(self_or_int, "\"a\""));
  auto list = must({{"anyOf", {{{"type", "integer"}}, {{"type", "array"}, {"items", {{"$ref", "#"}}}}}}});
  EXPECT_TRUE(accepts(list, "[1,[2,[3]],[]]"));
  auto twice = must({{"$defs", {{"n", {{"type", "integer"}}}}},
                     {"type", "object"},
                     {"properties", {{"a", {{"$ref", "#/$defs/n"}}}, {"b", {{"$ref", "#/$defs/n"}}}}}});
  EXPECT_TRUE(accepts(twice, R"({"a":1,"b":2})"));
  // 3,000 distinct unions each reaching one shared union of 3,000 values: 9 M flattening steps, a
  // body of about 200 KB. Refused as too large instead of taking the request thread's time and memory.
  json leaves = json::array(), wraps = json::array();
  for (int i = 0; i < 3000; ++i) leaves.push_back({{"const", i}});
  for (int i = 0; i < 3000; ++i) wraps.push_back({{"anyOf", {{{"$ref", "#/$defs/U"}}, {{"const", -1 - i}}}}});
  auto big = compile(json{{"$defs", {{"U", {{"anyOf", leaves}}}}}, {"type", "array"}, {"items", {{"anyOf", wraps}}}});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("too large"), std::string::npos) << big.status().message();
}

// Objects of up to 256 properties (required, duplicates, order), past the 64 of one machine word.
TEST(Grammar, ObjectsOfManyProperties) {
  json props = json::object();
  json required = json::array();
  for (int i = 0; i < 200; ++i) {
    props["p" + std::to_string(i)] = {{"type", "integer"}};
    required.push_back("p" + std::to_string(i));
  }
  auto g = must({{"type", "object"}, {"properties", props}, {"required", required}, {"additionalProperties", false}});
  auto object_text = [](int skip, int dup) {
    std::string t = "{";
    for (int i = 199; i >= 0; --i) {  // another order than the schema's
      if (i == skip) continue;
      if (t.size() > 1) t += ",";
      t += "\"p" + std::to_string(i) + "\":" + std::to_string(i);
      if (i == dup) t += ",\"p" + std::to_string(i) + "\":0";
    }
    return t + "}";
  };
  EXPECT_TRUE(accepts(g, object_text(-1, -1)));
  EXPECT_FALSE(accepts(g, object_text(150, -1)));  // a required property past the first 64 missing
  EXPECT_FALSE(accepts(g, object_text(-1, 130)));  // a duplicate past the first 64
  json too_many = json::object();
  for (int i = 0; i < 257; ++i) too_many["q" + std::to_string(i)] = {{"type", "null"}};
  auto e = compile(json{{"type", "object"}, {"properties", too_many}});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("more than 256 properties"), std::string::npos) << e.status().message();
}

// embed_schema: a schema's refs keep their targets when it is placed inside another one, and two
// embedded schemas' definitions of the same name stay apart.
TEST(Grammar, EmbeddedSchemasKeepTheirRefs) {
  const json a = {{"$defs", {{"N", {{"type", "integer"}}}}}, {"type", "array"}, {"items", {{"$ref", "#/$defs/N"}}}};
  const json b = {{"definitions", {{"N", {{"type", "string"}}}}},
                  {"anyOf", {{{"$ref", "#/definitions/N"}}, {{"type", "array"}, {"items", {{"$ref", "#"}}}}}},
                  {"description", "a $ref in an annotation: {\"$ref\": \"#\"}"}};
  json defs = json::object();
  const json ea = embed_schema(a, "t0", defs), eb = embed_schema(b, "t1", defs);
  auto g = must({{"type", "object"},
                 {"properties", {{"a", ea}, {"b", eb}, {"c", {{"const", {{"$ref", "#"}}}}}}},
                 {"required", {"a", "b"}},
                 {"$defs", defs}});
  EXPECT_TRUE(accepts(g, R"({"a":[1,2],"b":["x",["y",[]]]})"));
  EXPECT_FALSE(accepts(g, R"({"a":["x"],"b":"y"})"));  // a's N is an integer
  EXPECT_FALSE(accepts(g, R"({"a":[1],"b":1})"));      // b's N is a string
  EXPECT_TRUE(accepts(g, R"({"a":[],"b":"z","c":{"$ref":"#"}})"));  // a const value is not rewritten
}

TEST(Grammar, UnsupportedKeywordsAreErrors) {
  for (const json& s : {json{{"type", "string"}, {"pattern", "a"}}, json{{"type", "integer"}, {"minimum", 1}},
                        json{{"allOf", json::array({json::object()})}}, json{{"$ref", "http://x"}}, json{{"$ref", "#/$defs/missing"}},
                        json{{"type", "frob"}}, json(false), json{{"type", "array"}, {"minItems", 3}, {"maxItems", 1}}}) {
    auto g = compile(s);
    EXPECT_FALSE(g.ok()) << s.dump();
  }
  auto g = compile(json{{"type", "string"}, {"pattern", "a"}});
  EXPECT_NE(g.status().message().find("pattern"), std::string::npos);
}

// A vocabulary of bytes plus multi-byte tokens that cross structural boundaries.
std::vector<std::string> test_vocab() {
  std::vector<std::string> v = {"<eos>"};
  for (int b = 0x20; b < 0x7f; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"\":", "\",\"", "{\"", "\"}", "[\"", "\"]", "true", "false", "null", "12", "1.5", "e-3", " \"", "\n  ",
                        "name", "age", "tags", "\\u00", "é", "\xc3", "\xa9", "\":\"", "\":[", "},{", "],", "kind", "bc"})
    v.push_back(t);
  return v;
}

TEST(Grammar, MaskAgreesWithMatcherAndRandomWalksValidate) {
  auto vocab = test_vocab();
  std::vector<bool> excluded(vocab.size(), false);
  excluded[0] = true;
  auto trie = std::make_shared<TokenTrie>(vocab, excluded);
  std::mt19937 rng(42);
  const std::vector<json> schemas = {
      kPerson,
      json{{"type", "array"}, {"items", {{"anyOf", {{{"type", "integer"}}, {{"type", "string"}, {"maxLength", 2}}}}}}, {"maxItems", 4}},
      json{{"type", "object"}},
      json{{"enum", {"a", "bc", 1, 12}}},
  };
  int completed = 0;
  for (const auto& schema : schemas) {
    auto g = must(schema);
    ASSERT_TRUE(g);
    for (int walk = 0; walk < 12; ++walk) {
      JsonSchemaConstraint c(g, trie, 0);
      std::string out;
      std::vector<bool> allowed(vocab.size());
      for (int step = 0; step < 300; ++step) {
        c.allowed_tokens(allowed);
        // Every token's admission must agree with the matcher (sampled subset for speed).
        for (size_t id = 1; id < vocab.size(); id += 1 + rng() % 3)
          EXPECT_EQ(allowed[id], c.matcher().can_advance(vocab[id])) << "token '" << vocab[id] << "' after '" << out << "'";
        EXPECT_EQ(allowed[0], c.is_complete());
        if (allowed[0] && (rng() % 2 == 0 || step > 200)) break;
        std::vector<int> cand;
        std::vector<double> w;
        for (size_t id = 1; id < vocab.size(); ++id)
          if (allowed[id]) {
            cand.push_back(static_cast<int>(id));
            char ch = vocab[id][0];
            w.push_back(ch == '"' || ch == '}' || ch == ']' ? 30.0 : vocab[id] == "\n  " || ch == ' ' ? 0.1 : 1.0);
          }
        if (cand.empty()) break;
        int tok = cand[std::discrete_distribution<size_t>(w.begin(), w.end())(rng)];
        c.accept_token(tok);
        out += vocab[tok];
      }
      if (c.is_complete()) {
        ++completed;
        auto v = json::parse(out, nullptr, false);
        ASSERT_FALSE(v.is_discarded()) << out;
        EXPECT_TRUE(validate(v, schema, schema)) << schema.dump() << " -> " << out;
      }
    }
  }
  EXPECT_GT(completed, 30);
}

// Byte-level vocabularies (every byte is a token, as in the built-in and official tokenizers) with
// UTF-8 fragments: inside strings the mask must agree with the matcher on every token, including
// continuation bytes, lead bytes and the lead-specific ranges (E0, ED, F0, F4), and EOS only when
// the document is complete; a walk that picks high bytes often must never reach a dead matcher.
TEST(Grammar, MaskAgreesWithMatcherOnEveryByte) {
  std::vector<std::string> vocab = {"<eos>"};
  for (int b = 1; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"{\"", "\":", "\"}", "\xe5\xb7\xa5\xe4\xbd", "\xb4\xed", "\xed\x9f", "\xed\xaf",
                        "\xf0\x9f", "\x98\x80", "\xf4\x8f", "\xe0\xa0", "\xe0\x9f", "\xc3\xa9\xc3", "ab\xcf"})
    vocab.push_back(t);
  std::vector<bool> excluded(vocab.size(), false);
  excluded[0] = true;
  auto trie = std::make_shared<TokenTrie>(vocab, excluded);
  std::mt19937 rng(7);
  auto g = any_object();
  int completed = 0;
  for (int walk = 0; walk < 40; ++walk) {
    JsonSchemaConstraint c(g, trie, 0);
    std::string out;
    std::vector<bool> allowed(vocab.size());
    for (int step = 0; step < 200; ++step) {
      c.allowed_tokens(allowed);
      for (size_t id = 1; id < vocab.size(); ++id)
        ASSERT_EQ(allowed[id], c.matcher().can_advance(vocab[id]))
            << "token " << id << " after " << testing::PrintToString(out);
      ASSERT_EQ(allowed[0], c.is_complete()) << testing::PrintToString(out);
      ASSERT_FALSE(c.matcher().is_dead()) << testing::PrintToString(out);
      if (allowed[0] && (rng() % 3 == 0 || step > 150)) break;
      std::vector<int> cand;
      std::vector<double> w;
      for (size_t id = 1; id < vocab.size(); ++id)
        if (allowed[id]) {
          cand.push_back(static_cast<int>(id));
          const unsigned char ch = static_cast<unsigned char>(vocab[id][0]);
          w.push_back(ch >= 0x80 ? 4.0 : (ch == '"' || ch == '}' ? 6.0 : 1.0));
        }
      if (cand.empty()) break;
      const int tok = cand[std::discrete_distribution<size_t>(w.begin(), w.end())(rng)];
      c.accept_token(tok);
      out += vocab[tok];
    }
    completed += c.is_complete();
  }
  EXPECT_GT(completed, 10);
}

// A key may be at most 256 bytes: a multi-byte character must fit whole, else the key would be
// stuck after its lead byte (found by the e2e suite against a random-weight model on the GPU).
TEST(Grammar, LongKeysNeverStrandALeadByte) {
  auto g = any_object();
  for (size_t len : {253u, 254u, 255u, 256u}) {
    Matcher m(g);
    ASSERT_TRUE(m.advance("{\"" + std::string(len, 'k')));
    const bool two = len + 2 <= 256, three = len + 3 <= 256;
    EXPECT_EQ(m.can_advance("\xcf"), two) << len;
    EXPECT_EQ(m.can_advance("\xcf\x8f"), two) << len;
    EXPECT_EQ(m.can_advance("\xe5"), three) << len;
    EXPECT_EQ(m.can_advance("a"), len < 256) << len;
    EXPECT_TRUE(m.can_advance("\"")) << len;
    if (two) {
      ASSERT_TRUE(m.advance("\xcf"));
      EXPECT_TRUE(m.can_advance("\x8f")) << "a lead byte accepted must have a continuation";
    }
  }
}

// Whether `out` ends inside a JSON string (an odd number of unescaped quotes).
bool inside_string(const std::string& out) {
  bool in = false;
  for (size_t i = 0; i < out.size(); ++i) {
    if (in && out[i] == '\\') ++i;
    else if (out[i] == '"') in = !in;
  }
  return in;
}

// A weak model that prefers whitespace between JSON tokens: there it picks the longest allowed
// whitespace token, else the allowed token earliest in `preference` (closing brackets and quotes
// first, so the document ends as soon as the schema lets it). (Spaces inside a string are its
// content, which no formatter touches.) Returns the output text; `tokens` counts steps.
std::string whitespace_loving_walk(const std::shared_ptr<const Grammar>& g, const std::vector<std::string>& vocab,
                                   int max_tokens, int* tokens) {
  std::vector<bool> excluded(vocab.size(), false);
  excluded[0] = true;
  auto trie = std::make_shared<TokenTrie>(vocab, excluded);
  JsonSchemaConstraint c(g, trie, 0);
  const std::string preference = "\"}]0123456789abcdefghijklmnopqrstuvwxyz:,{[";
  std::string out;
  std::vector<bool> allowed(vocab.size());
  *tokens = 0;
  for (; *tokens < max_tokens; ++*tokens) {
    c.allowed_tokens(allowed);
    int pick = -1;
    for (size_t id = 1; id < vocab.size(); ++id) {
      bool ws = vocab[id].find_first_not_of(" \n\t\r") == std::string::npos;
      if (allowed[id] && ws && !inside_string(out) && (pick < 0 || vocab[id].size() > vocab[pick].size())) pick = static_cast<int>(id);
    }
    for (size_t p = 0; pick < 0 && p < preference.size(); ++p)
      for (size_t id = 1; id < vocab.size(); ++id)
        if (allowed[id] && vocab[id] == std::string(1, preference[p])) { pick = static_cast<int>(id); break; }
    if (pick < 0) break;  // only EOS left
    c.accept_token(pick);
    out += vocab[pick];
  }
  EXPECT_TRUE(c.is_complete()) << out;
  return out;
}

TEST(Grammar, WhitespaceIsBoundedByWhatAFormatterWrites) {
  std::vector<std::string> vocab = test_vocab();
  for (const char* ws : {" ", "  ", "    ", "        ", "\n", "\n\n", "\n        ", "\t", "\r\n", "\n\n\n\n"})
    vocab.push_back(ws);
  auto g = must(kPerson);
  ASSERT_TRUE(g);
  int tokens = 0;
  std::string out = whitespace_loving_walk(g, vocab, 200, &tokens);
  auto v = json::parse(out, nullptr, false);
  ASSERT_FALSE(v.is_discarded()) << out;
  EXPECT_TRUE(validate(v, kPerson, kPerson)) << out;
  // Every whitespace run is one space, or one newline and at most 4 spaces per nesting level.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < out.size();) {
    char ch = out[i];
    if (in_string) {
      if (ch == '\\') ++i;
      else if (ch == '"') in_string = false;
      ++i;
      continue;
    }
    if (ch == '"') in_string = true;
    if (ch == '{' || ch == '[') ++depth;
    if (ch == '}' || ch == ']') --depth;
    if (ch != ' ' && ch != '\n' && ch != '\t' && ch != '\r') {
      ++i;
      continue;
    }
    size_t j = out.find_first_not_of(" \n\t\r", i);
    std::string run = out.substr(i, j - i);
    if (run[0] == '\n') {
      EXPECT_EQ(run.find_first_of("\n\r", 1), std::string::npos) << "two newlines in one gap: " << out;
      EXPECT_LE(run.size() - 1, static_cast<size_t>(kMaxIndentPerLevel * (depth + 1))) << out;
    } else {
      EXPECT_EQ(run, " ") << out;
    }
    i = j;
  }
  EXPECT_LT(tokens, 200) << out;  // it ended by itself

  auto compact = compile(kPerson, JsonWhitespace::kNone);
  ASSERT_TRUE(compact.ok());
  out = whitespace_loving_walk(*compact, vocab, 200, &tokens);
  EXPECT_EQ(out.find_first_of(" \n\t\r"), std::string::npos) << out;
  EXPECT_FALSE(json::parse(out, nullptr, false).is_discarded()) << out;
  EXPECT_FALSE(accepts(*compact, R"({"name": "bo","age":3,"tags":["x"]})"));
  EXPECT_TRUE(accepts(*compact, R"({"name":"bo","age":3,"tags":["x"]})"));
  EXPECT_TRUE(accepts(g, "{\n  \"name\": \"bo\",\n  \"age\": 3,\n  \"tags\": [\n    \"x\"\n  ]\n}"));
  EXPECT_FALSE(accepts(g, "{\n\n  \"name\": \"bo\",\"age\":3,\"tags\":[\"x\"]}"));
  EXPECT_FALSE(accepts(g, "{\"name\":  \"bo\",\"age\":3,\"tags\":[\"x\"]}"));
  EXPECT_FALSE(accepts(g, "{\"name\":\"bo\",\"age\":3,\"tags\":[\n  \n  \"x\"]}"));  // two gaps in one
  EXPECT_TRUE(parse_json_whitespace("none").ok());
  EXPECT_FALSE(parse_json_whitespace("lots").ok());
}

TEST(Grammar, CloneIsIndependent) {
  std::vector<std::string> vocab = {"<eos>", "{", "}", "\"", "a", ":", "1"};
  auto trie = std::make_shared<TokenTrie>(vocab, std::vector<bool>{true, false, false, false, false, false, false});
  JsonSchemaConstraint c(any_object(), trie, 0);
  c.accept_token(1);
  auto d = c.clone();
  c.accept_token(2);
  EXPECT_TRUE(c.is_complete());
  EXPECT_FALSE(d->is_complete());
  std::vector<bool> allowed(vocab.size());
  d->allowed_tokens(allowed);
  EXPECT_TRUE(allowed[2] && allowed[3]);
  EXPECT_FALSE(allowed[1] || allowed[4] || allowed[0]);
}

}  // namespace
}  // namespace tandem::json_grammar

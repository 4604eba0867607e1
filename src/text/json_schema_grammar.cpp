// JSON Schema subset -> node graph; a nondeterministic character-level pushdown matcher (a set of
// live frame stacks, forking at anyOf and at number/literal ends); token masks by walking the
// token trie depth-first while advancing the stack set one byte per edge.
#include "text/json_schema_grammar.h"

#include <algorithm>
#include <array>
#include <map>
#include <set>

#include "common/check.h"
#include "text/tokenizer.h"

namespace tandem::json_grammar {

using json = nlohmann::json;

enum class Kind : uint8_t { kAnyOf, kObject, kArray, kString, kNumber, kInteger, kLiteral };

// An object's properties, by their index in Node::props (at most kMaxProps a schema object).
constexpr size_t kMaxProps = 256;
struct PropSet {
  std::array<uint64_t, kMaxProps / 64> w{};
  bool has(size_t i) const { return w[i >> 6] >> (i & 63) & 1; }
  void set(size_t i) { w[i >> 6] |= uint64_t{1} << (i & 63); }
  bool covers(const PropSet& o) const {
    for (size_t k = 0; k < w.size(); ++k)
      if ((w[k] & o.w[k]) != o.w[k]) return false;
    return true;
  }
  bool operator==(const PropSet& o) const = default;
};

struct Node {
  Kind kind = Kind::kAnyOf;
  std::vector<int> alts;                             // kAnyOf
  std::vector<std::pair<std::string, int>> props;    // kObject
  PropSet required;
  int additional = -1;                               // -1 = no additional properties
  int items = -1;                                    // kArray (-1 never happens after compile)
  int64_t min_items = 0, max_items = -1;
  int64_t min_len = 0, max_len = -1;                 // kString, in code points
  std::vector<std::string> literals;                 // kLiteral: serialized JSON texts
};

Grammar::~Grammar() = default;
const Node& Grammar::node(int i) const { return nodes_[static_cast<size_t>(i)]; }

// ---------------------------------------------------------------- compiler
namespace {

class Compiler {
 public:
  explicit Compiler(const json& root) : root_(root) {}
  std::vector<Node> nodes;

  Result<int> compile(const json& s, const std::string& path, int depth) {
    if (depth > 64) return invalid_argument("{}: schema nested too deeply", path);
    if (s.is_boolean()) {
      if (!s.get<bool>()) return invalid_argument("{}: 'false' schema matches nothing", path);
      return any();
    }
    if (!s.is_object()) return invalid_argument("{}: a schema must be an object or a boolean", path);
    static const std::set<std::string> kIgnored = {"title", "description", "default", "examples", "format", "$schema",
                                                   "$id", "$comment", "strict", "$defs", "definitions", "readOnly",
                                                   "writeOnly", "deprecated", "nullable"};
    static const std::set<std::string> kKnown = {"type", "properties", "required", "additionalProperties", "items",
                                                 "minItems", "maxItems", "minLength", "maxLength", "enum", "const",
                                                 "anyOf", "oneOf", "$ref"};
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (!kIgnored.count(it.key()) && !kKnown.count(it.key()))
        return invalid_argument("{}: unsupported schema keyword '{}'", path, it.key());
    }
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return invalid_argument("{}.$ref must be a string", path);
      return ref(s["$ref"].get<std::string>(), path, depth);
    }
    if (s.contains("const")) return literal_node({s["const"]});
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) return invalid_argument("{}.enum must be a non-empty array", path);
      std::vector<json> vals(s["enum"].begin(), s["enum"].end());
      return literal_node(vals);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (s.contains(key)) {
        const json& arr = s[key];
        if (!arr.is_array() || arr.empty()) return invalid_argument("{}.{} must be a non-empty array", path, key);
        std::vector<int> alts;
        for (size_t i = 0; i < arr.size(); ++i) {
          // Sibling keywords (e.g. "type" next to "anyOf") are not merged; reject rather than ignore.
          TANDEM_ASSIGN_OR_RETURN(int a, compile(arr[i], fmt::format("{}.{}[{}]", path, key, i), depth + 1));
          alts.push_back(a);
        }
        if (s.contains("type") || s.contains("properties")) return invalid_argument("{}: '{}' next to 'type'/'properties' is not supported", path, key);
        return add_anyof(alts);
      }
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array()) {
        for (const auto& x : t) {
          if (!x.is_string()) return invalid_argument("{}.type entries must be strings", path);
          types.push_back(x.get<std::string>());
        }
      } else {
        return invalid_argument("{}.type must be a string or an array", path);
      }
      if (types.empty()) return invalid_argument("{}.type must not be empty", path);
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items")) {
      types.push_back("array");
    } else {
      return any();
    }
    std::vector<int> alts;
    for (const auto& t : types) {
      TANDEM_ASSIGN_OR_RETURN(int a, typed(s, t, path, depth));
      alts.push_back(a);
    }
    return alts.size() == 1 ? alts[0] : add_anyof(alts);
  }

  // Every alternative node lists the value nodes (object, array, string, number, literal) reachable
  // from it through alternatives alone, in first-reached order, each once. The matcher then never
  // expands an alternative into another, so refs that reach each other through anyOf/oneOf alone
  // ({"$defs": {"A": {"anyOf": [int, {"$ref": B}]}, "B": {"anyOf": [string, {"$ref": A}]}}}) match
  // what they mean instead of expanding forever (recursion through an object or an array consumes
  // a '{' or '[' first). One that reaches no value node at all ({"$ref": "#"}) matches nothing.
  // Every node a flattening visits counts against kMaxFlattenSteps: distinct unions that each reach
  // one large shared union cost their product, which a 32 MB body can make billions.
  static constexpr int64_t kMaxFlattenSteps = int64_t{1} << 22;
  Status flatten_alternatives() {
    std::vector<std::vector<int>> flat(nodes.size());
    std::vector<int> seen(nodes.size(), -1), todo;
    int64_t steps = 0;
    for (size_t start = 0; start < nodes.size(); ++start) {
      if (nodes[start].kind != Kind::kAnyOf) continue;
      todo.assign(nodes[start].alts.rbegin(), nodes[start].alts.rend());
      seen[start] = static_cast<int>(start);
      while (!todo.empty()) {
        const int a = todo.back();
        todo.pop_back();
        if (seen[static_cast<size_t>(a)] == static_cast<int>(start)) continue;
        seen[static_cast<size_t>(a)] = static_cast<int>(start);
        if (++steps > kMaxFlattenSteps)
          return invalid_argument("schema: its anyOf/oneOf alternatives expand to more than {} (too large)",
                                  kMaxFlattenSteps);
        const Node& n = nodes[static_cast<size_t>(a)];
        if (n.kind != Kind::kAnyOf) flat[start].push_back(a);
        else todo.insert(todo.end(), n.alts.rbegin(), n.alts.rend());
      }
      if (flat[start].empty()) {
        std::string name = "an anyOf/oneOf";
        for (const auto& [r, slot] : refs_)
          if (slot == static_cast<int>(start)) name = "$ref '" + r + "'";
        return invalid_argument(
            "schema: {} refers only back to itself (through anyOf/oneOf, no object or array in between), so it "
            "matches no value",
            name);
      }
    }
    for (size_t k = 0; k < nodes.size(); ++k)
      if (nodes[k].kind == Kind::kAnyOf) nodes[k].alts = std::move(flat[k]);
    return Status();
  }

 private:
  const json& root_;
  std::map<std::string, int> refs_;
  int any_ = -1;

  int add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<int>(nodes.size()) - 1;
  }
  int add_anyof(std::vector<int> alts) {
    Node n;
    n.kind = Kind::kAnyOf;
    n.alts = std::move(alts);
    return add(std::move(n));
  }
  int literal_node(const std::vector<json>& vals) {
    Node n;
    n.kind = Kind::kLiteral;
    for (const auto& v : vals) n.literals.push_back(v.dump(-1, ' ', false, json::error_handler_t::replace));
    return add(std::move(n));
  }

  // Any JSON value (recursive).
  int any() {
    if (any_ >= 0) return any_;
    any_ = add_anyof({});
    Node obj;
    obj.kind = Kind::kObject;
    obj.additional = any_;
    int o = add(obj);
    Node arr;
    arr.kind = Kind::kArray;
    arr.items = any_;
    int a = add(arr);
    Node str;
    str.kind = Kind::kString;
    int st = add(str);
    Node num;
    num.kind = Kind::kNumber;
    int nu = add(num);
    int lit = literal_node({json(true), json(false), json(nullptr)});
    nodes[static_cast<size_t>(any_)].alts = {o, a, st, nu, lit};
    return any_;
  }

  Result<int> ref(const std::string& r, const std::string& path, int depth) {
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    std::string prefix;
    if (r.rfind("#/$defs/", 0) == 0) prefix = "$defs";
    else if (r.rfind("#/definitions/", 0) == 0) prefix = "definitions";
    else if (r == "#") prefix = "#";
    else return invalid_argument("{}: unsupported $ref '{}' (only #, #/$defs/NAME, #/definitions/NAME)", path, r);
    const json* target = &root_;
    if (prefix != "#") {
      std::string name = r.substr(prefix.size() + 3);
      if (!root_.contains(prefix) || !root_[prefix].is_object() || !root_[prefix].contains(name))
        return invalid_argument("{}: $ref '{}' does not resolve", path, r);
      target = &root_[prefix][name];
    }
    // Placeholder first, so recursive references resolve to it.
    int slot = add_anyof({});
    refs_[r] = slot;
    TANDEM_ASSIGN_OR_RETURN(int body, compile(*target, r, depth + 1));
    nodes[static_cast<size_t>(slot)].alts = {body};
    return slot;
  }

  Result<int64_t> count(const json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return int64_t{-1};
    if (!s[key].is_number_integer() || s[key].get<int64_t>() < 0) return invalid_argument("{}.{} must be a non-negative integer", path, key);
    return s[key].get<int64_t>();
  }

  Result<int> typed(const json& s, const std::string& t, const std::string& path, int depth) {
    Node n;
    if (t == "string") {
      n.kind = Kind::kString;
      TANDEM_ASSIGN_OR_RETURN(int64_t mn, count(s, "minLength", path));
      TANDEM_ASSIGN_OR_RETURN(int64_t mx, count(s, "maxLength", path));
      n.min_len = std::max<int64_t>(0, mn);
      n.max_len = mx;
      if (mx >= 0 && mx < n.min_len) return invalid_argument("{}: maxLength < minLength", path);
      return add(std::move(n));
    }
    if (t == "number") { n.kind = Kind::kNumber; return add(std::move(n)); }
    if (t == "integer") { n.kind = Kind::kInteger; return add(std::move(n)); }
    if (t == "boolean") return literal_node({json(true), json(false)});
    if (t == "null") return literal_node({json(nullptr)});
    if (t == "array") {
      n.kind = Kind::kArray;
      TANDEM_ASSIGN_OR_RETURN(int64_t mn, count(s, "minItems", path));
      TANDEM_ASSIGN_OR_RETURN(int64_t mx, count(s, "maxItems", path));
      n.min_items = std::max<int64_t>(0, mn);
      n.max_items = mx;
      if (mx >= 0 && mx < n.min_items) return invalid_argument("{}: maxItems < minItems", path);
      if (s.contains("items")) {
        if (s["items"].is_array()) return invalid_argument("{}.items: tuple form is not supported", path);
        TANDEM_ASSIGN_OR_RETURN(int it, compile(s["items"], path + ".items", depth + 1));
        n.items = it;
      } else {
        n.items = any();
      }
      return add(std::move(n));
    }
    if (t == "object") {
      n.kind = Kind::kObject;
      if (s.contains("properties")) {
        if (!s["properties"].is_object()) return invalid_argument("{}.properties must be an object", path);
        if (s["properties"].size() > kMaxProps)
          return invalid_argument("{}: more than {} properties", path, kMaxProps);
        for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
          for (char c : it.key())
            if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20)
              return invalid_argument("{}: property name '{}' needs escaping (unsupported)", path, it.key());
          TANDEM_ASSIGN_OR_RETURN(int p, compile(it.value(), path + ".properties." + it.key(), depth + 1));
          n.props.emplace_back(it.key(), p);
        }
      }
      if (s.contains("required")) {
        if (!s["required"].is_array()) return invalid_argument("{}.required must be an array", path);
        for (const auto& r : s["required"]) {
          if (!r.is_string()) return invalid_argument("{}.required entries must be strings", path);
          bool found = false;
          for (size_t i = 0; i < n.props.size(); ++i)
            if (n.props[i].first == r.get<std::string>()) { n.required.set(i); found = true; }
          if (!found) return invalid_argument("{}: required property '{}' is not in properties", path, r.get<std::string>());
        }
      }
      if (s.contains("additionalProperties")) {
        const json& ap = s["additionalProperties"];
        if (ap.is_boolean()) n.additional = ap.get<bool>() ? any() : -1;
        else {
          TANDEM_ASSIGN_OR_RETURN(int a, compile(ap, path + ".additionalProperties", depth + 1));
          n.additional = a;
        }
      } else {
        // JSON Schema default is "allowed"; with declared properties we stay strict (as OpenAI's
        // strict mode requires), so the output is always exactly the declared shape.
        n.additional = n.props.empty() ? any() : -1;
      }
      return add(std::move(n));
    }
    return invalid_argument("{}: unknown type '{}'", path, t);
  }
};

}  // namespace

Result<JsonWhitespace> parse_json_whitespace(const std::string& name) {
  if (name == "formatted") return JsonWhitespace::kFormatted;
  if (name == "none") return JsonWhitespace::kNone;
  return invalid_argument("expected formatted or none, got '{}'", name);
}

Result<std::shared_ptr<const Grammar>> compile(const json& schema, JsonWhitespace ws) {
  try {
    Compiler c(schema);
    auto root = c.compile(schema, "schema", 0);
    if (!root.ok()) return root.status();
    TANDEM_RETURN_IF_ERROR(c.flatten_alternatives());
    auto g = std::make_shared<Grammar>();
    g->nodes_ = std::move(c.nodes);
    g->root_ = *root;
    g->whitespace_ = ws;
    return std::shared_ptr<const Grammar>(g);
  } catch (const std::exception& e) {
    return invalid_argument("schema: {}", e.what());
  }
}

namespace {
// `s` with every $ref rewritten into `scope`'s names (see embed_schema); values are not schemas.
json scope_refs(const json& s, const std::string& scope) {
  if (s.is_array()) {
    json out = json::array();
    for (const auto& x : s) out.push_back(scope_refs(x, scope));
    return out;
  }
  if (!s.is_object()) return s;
  json out = json::object();
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (k == "const" || k == "enum" || k == "default" || k == "examples") {
      out[k] = it.value();
    } else if (k == "$ref" && it.value().is_string()) {
      const std::string r = it.value().get<std::string>();
      if (r == "#") out[k] = "#/$defs/" + scope;
      else if (r.rfind("#/$defs/", 0) == 0) out[k] = "#/$defs/" + scope + "/$defs/" + r.substr(8);
      else if (r.rfind("#/definitions/", 0) == 0) out[k] = "#/$defs/" + scope + "/definitions/" + r.substr(14);
      else out[k] = r;  // unsupported: the compiler names it
    } else if (k == "properties" && it.value().is_object()) {
      json props = json::object();  // property names are names, not keywords
      for (auto p = it.value().begin(); p != it.value().end(); ++p) props[p.key()] = scope_refs(p.value(), scope);
      out[k] = props;
    } else {
      out[k] = scope_refs(it.value(), scope);
    }
  }
  return out;
}
}  // namespace

json embed_schema(const json& schema, const std::string& scope, json& defs) {
  if (!defs.is_object()) defs = json::object();
  json root = schema;
  if (schema.is_object()) {
    for (const char* where : {"$defs", "definitions"}) {
      if (!schema.contains(where) || !schema[where].is_object()) continue;
      for (auto it = schema[where].begin(); it != schema[where].end(); ++it)
        defs[scope + "/" + where + "/" + it.key()] = scope_refs(it.value(), scope);
      root.erase(where);
    }
  }
  defs[scope] = scope_refs(root, scope);
  return json{{"$ref", "#/$defs/" + scope}};
}

std::shared_ptr<const Grammar> any_object(JsonWhitespace ws) {
  auto make = [](JsonWhitespace w) {
    auto r = compile(json{{"type", "object"}}, w);
    TANDEM_CHECK(r.ok());
    return *r;
  };
  static const std::shared_ptr<const Grammar> formatted = make(JsonWhitespace::kFormatted);
  static const std::shared_ptr<const Grammar> none = make(JsonWhitespace::kNone);
  return ws == JsonWhitespace::kNone ? none : formatted;
}

// ---------------------------------------------------------------- matcher
namespace {

enum class F : uint8_t { kEnd, kValue, kObject, kArray, kString, kNumber, kLiteral };

// Object states.
enum : uint8_t { kObjOpen, kObjKey, kObjAfterKey, kObjAfterValue, kObjAfterComma };
// Array states.
enum : uint8_t { kArrOpen, kArrAfterValue, kArrAfterComma };
// Number states.
enum : uint8_t { kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };

struct Frame {
  F type = F::kEnd;
  uint8_t state = 0;
  uint8_t ws = 0;          // whitespace in the current gap: kWsNewline | spaces after it
  uint8_t esc = 0;         // string: 0 none, 1 after '\', 2..5 in \uXXXX; utf8 continuation count in `cont`
  uint8_t cont = 0;
  int node = -1;
  int value_node = -1;     // object: node of the property being read
  int64_t count = 0;       // string length / array items / literal position
  PropSet seen;            // object: properties seen
  std::string key;         // object key so far / literal text so far
  bool operator==(const Frame& o) const {
    return type == o.type && state == o.state && ws == o.ws && esc == o.esc && cont == o.cont && node == o.node &&
           value_node == o.value_node && count == o.count && seen == o.seen && key == o.key;
  }
};

using Stack = std::vector<Frame>;
constexpr size_t kMaxStacks = 64;
constexpr size_t kMaxKeyBytes = 256;  // object keys are at most this many bytes

bool is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
constexpr uint8_t kWsNewline = 0x80;  // Frame::ws: the gap has had its newline

// String body byte (after the opening quote). Sets f.state = 1 when the closing quote is consumed.
bool string_char(Frame& f, const Node& n, unsigned char c) {
  if (f.cont > 0) {
    if ((c & 0xC0) != 0x80) return false;
    --f.cont;
    return true;
  }
  if (f.esc == 1) {
    if (c == 'u') { f.esc = 2; return true; }
    if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
      f.esc = 0;
      ++f.count;
      return true;
    }
    return false;
  }
  if (f.esc >= 2) {
    if (!std::isxdigit(c)) return false;
    if (++f.esc == 6) { f.esc = 0; ++f.count; }
    return true;
  }
  if (c == '"') {
    if (f.count < n.min_len) return false;
    f.state = 1;
    return true;
  }
  if (n.max_len >= 0 && f.count >= n.max_len) return false;
  if (c == '\\') { f.esc = 1; return true; }
  if (c < 0x20) return false;
  if (c >= 0x80) {
    if (c >= 0xC2 && c <= 0xDF) f.cont = 1;
    else if (c >= 0xE0 && c <= 0xEF) f.cont = 2;
    else if (c >= 0xF0 && c <= 0xF4) f.cont = 3;
    else return false;
  }
  ++f.count;
  return true;
}


class Stepper {
 public:
  explicit Stepper(const Grammar& g) : g_(g) {}

  // All successors of stack `s` after byte c.
  void step(Stack s, unsigned char c, std::vector<Stack>& out, int depth = 0) {
    if (s.empty() || depth > 200) return;
    Frame& f = s.back();
    switch (f.type) {
      case F::kEnd:
        return;
      case F::kValue:
        return value(std::move(s), c, out, depth);
      case F::kString:
        if (string_char(f, g_.node(f.node), c)) {
          if (f.state == 1) s.pop_back();  // closing quote consumed
          out.push_back(std::move(s));
        }
        return;
      case F::kNumber: {
        bool integer = g_.node(f.node).kind == Kind::kInteger;
        bool complete = f.state == kNumZero || f.state == kNumInt || f.state == kNumFrac || f.state == kNumExp;
        Stack cont = s;
        if (number_char(cont.back(), c, integer)) out.push_back(std::move(cont));
        if (complete) {
          s.pop_back();
          step(std::move(s), c, out, depth + 1);
        }
        return;
      }
      case F::kLiteral: {
        const Node& n = g_.node(f.node);
        bool complete = false, extendable = false;
        std::string next = f.key + static_cast<char>(c);
        for (const auto& lit : n.literals) {
          if (lit == f.key) complete = true;
          if (lit.compare(0, next.size(), next) == 0) extendable = true;
        }
        if (extendable) {
          Stack cont = s;
          cont.back().key = next;
          out.push_back(std::move(cont));
        }
        if (complete) {
          s.pop_back();
          step(std::move(s), c, out, depth + 1);
        }
        return;
      }
      case F::kObject:
        return object(std::move(s), c, out, depth);
      case F::kArray:
        return array(std::move(s), c, out, depth);
    }
  }

  bool complete(const Stack& s) const {
    if (s.empty()) return false;
    if (s.back().type == F::kEnd) return s.size() == 1;
    if (s.size() != 2 || s[0].type != F::kEnd) return false;
    const Frame& f = s.back();
    if (f.type == F::kNumber) return f.state == kNumZero || f.state == kNumInt || f.state == kNumFrac || f.state == kNumExp;
    if (f.type == F::kLiteral) {
      for (const auto& lit : g_.node(f.node).literals)
        if (lit == f.key) return true;
    }
    return false;
  }

 private:
  const Grammar& g_;

  // Whitespace as a formatter writes it (JsonWhitespace): one space, or one newline and an indent
  // bounded by the nesting depth (the stack holds kEnd plus one frame per open container/value).
  bool ws_ok(Frame& f, unsigned char c, size_t stack_size) const {
    if (!is_ws(c) || g_.whitespace() == JsonWhitespace::kNone) return false;
    if (c == '\n') {
      if (f.ws != 0) return false;
      f.ws = kWsNewline;
      return true;
    }
    if (c == '\r') return false;
    if (!(f.ws & kWsNewline)) {
      if (f.ws != 0) return false;  // one space without a newline
      f.ws = 1;
      return true;
    }
    const size_t indent = f.ws & 0x7f;
    if (indent >= std::min<size_t>(0x7f, kMaxIndentPerLevel * stack_size)) return false;
    ++f.ws;
    return true;
  }

  void value(Stack s, unsigned char c, std::vector<Stack>& out, int depth) {
    Frame& f = s.back();
    // Root value (directly above kEnd) allows no leading whitespace.
    if (is_ws(c)) {
      if (s.size() > 2 && ws_ok(f, c, s.size() - 2)) out.push_back(std::move(s));
      return;
    }
    const Node& n = g_.node(f.node);
    Frame nf;
    nf.node = f.node;
    switch (n.kind) {
      case Kind::kAnyOf:
        for (int a : n.alts) {
          Stack alt = s;
          alt.back().node = a;
          value(std::move(alt), c, out, depth + 1);
        }
        return;
      case Kind::kObject:
        if (c != '{') return;
        nf.type = F::kObject;
        nf.state = kObjOpen;
        break;
      case Kind::kArray:
        if (c != '[') return;
        nf.type = F::kArray;
        nf.state = kArrOpen;
        break;
      case Kind::kString:
        if (c != '"') return;
        nf.type = F::kString;
        break;
      case Kind::kNumber:
      case Kind::kInteger:
        if (c == '-') nf.state = kNumMinus;
        else if (c == '0') nf.state = kNumZero;
        else if (c >= '1' && c <= '9') nf.state = kNumInt;
        else return;
        nf.type = F::kNumber;
        break;
      case Kind::kLiteral: {
        std::string first(1, static_cast<char>(c));
        bool ok = false;
        for (const auto& lit : n.literals) ok = ok || lit.compare(0, 1, first) == 0;
        if (!ok) return;
        nf.type = F::kLiteral;
        nf.key = first;
        break;
      }
    }
    s.back() = std::move(nf);
    out.push_back(std::move(s));
  }

  static bool number_char(Frame& f, unsigned char c, bool integer) {
    bool digit = c >= '0' && c <= '9';
    // Bounded length keeps masks finite; integers stay within int64 so clients parse them exactly.
    if (++f.count > (integer ? 18 : 40)) return false;
    switch (f.state) {
      case kNumMinus:
        if (c == '0') { f.state = kNumZero; return true; }
        if (digit) { f.state = kNumInt; return true; }
        return false;
      case kNumZero:
      case kNumInt:
        if (digit && f.state == kNumInt) return true;
        if (integer) return false;
        if (c == '.') { f.state = kNumDot; return true; }
        if (c == 'e' || c == 'E') { f.state = kNumE; return true; }
        return false;
      case kNumDot:
        if (digit) { f.state = kNumFrac; return true; }
        return false;
      case kNumFrac:
        if (digit) return true;
        if (c == 'e' || c == 'E') { f.state = kNumE; return true; }
        return false;
      // Exponents have at most two digits, so every accepted number is a finite double.
      case kNumE:
        if (c == '+' || c == '-') { f.state = kNumESign; return true; }
        if (digit) { f.state = kNumExp; f.esc = 1; return true; }
        return false;
      case kNumESign:
        if (digit) { f.state = kNumExp; f.esc = 1; return true; }
        return false;
      case kNumExp:
        if (!digit || f.esc >= 2) return false;
        ++f.esc;
        return true;
    }
    return false;
  }

  // Can another property still be added?
  bool more_keys(const Frame& f, const Node& n) const {
    if (n.additional >= 0) return true;
    for (size_t i = 0; i < n.props.size(); ++i)
      if (!f.seen.has(i)) return true;
    return false;
  }

  void object(Stack s, unsigned char c, std::vector<Stack>& out, int depth) {
    Frame& f = s.back();
    const Node& n = g_.node(f.node);
    bool required_done = f.seen.covers(n.required);
    switch (f.state) {
      case kObjOpen:
      case kObjAfterComma:
        if (ws_ok(f, c, s.size() - 1)) break;
        if (c == '"' && more_keys(f, n)) {
          f.state = kObjKey;
          f.key.clear();
          f.ws = 0;
          break;
        }
        if (c == '}' && f.state == kObjOpen && required_done) {
          s.pop_back();
          break;
        }
        return;
      case kObjKey: {
        // Keys are UTF-8 like string values: a lead byte needs its continuation bytes.
        if (f.cont > 0 && (c & 0xC0) != 0x80) return;
        if (f.cont == 0 && c >= 0x80) {
          if (c >= 0xC2 && c <= 0xDF) f.cont = 2;
          else if (c >= 0xE0 && c <= 0xEF) f.cont = 3;
          else if (c >= 0xF0 && c <= 0xF4) f.cont = 4;
          else return;
        }
        // The key length limit holds the whole character: a lead byte needs room for its sequence,
        // or the key would be stuck after it (no continuation fits, no quote may close it).
        if (f.cont > 0 && c >= 0xC0 && f.key.size() + f.cont > kMaxKeyBytes) return;
        if (f.cont > 0) --f.cont;  // (counts the lead byte too, so 0 again after the last one)
        if (c == '"') {
          f.value_node = -1;
          for (size_t i = 0; i < n.props.size(); ++i) {
            if (n.props[i].first == f.key) {
              if (f.seen.has(i)) return;  // duplicate
              f.seen.set(i);
              f.value_node = n.props[i].second;
            }
          }
          if (f.value_node < 0) {
            if (n.additional < 0) return;
            f.value_node = n.additional;
          }
          f.state = kObjAfterKey;
          f.ws = 0;
          break;
        }
        if (c == '\\' || c < 0x20) return;  // keys are written unescaped
        std::string next = f.key + static_cast<char>(c);
        bool ok = n.additional >= 0;
        for (size_t i = 0; i < n.props.size() && !ok; ++i)
          ok = !f.seen.has(i) && n.props[i].first.compare(0, next.size(), next) == 0;
        if (!ok || next.size() > kMaxKeyBytes) return;
        f.key = std::move(next);
        break;
      }
      case kObjAfterKey:
        if (ws_ok(f, c, s.size() - 1)) break;
        if (c != ':') return;
        {
          int vn = f.value_node;
          f.state = kObjAfterValue;
          f.ws = 0;
          f.key.clear();
          Frame v;
          v.type = F::kValue;
          v.node = vn;
          v.ws = 0;
          s.push_back(std::move(v));
        }
        break;
      case kObjAfterValue:
        if (ws_ok(f, c, s.size() - 1)) break;
        if (c == ',' && more_keys(f, n)) {
          f.state = kObjAfterComma;
          f.ws = 0;
          break;
        }
        if (c == '}' && required_done) {
          s.pop_back();
          break;
        }
        return;
    }
    out.push_back(std::move(s));
    (void)depth;
  }

  void array(Stack s, unsigned char c, std::vector<Stack>& out, int depth) {
    Frame& f = s.back();
    const Node& n = g_.node(f.node);
    switch (f.state) {
      case kArrOpen:
      case kArrAfterComma:
        if (ws_ok(f, c, s.size() - 1)) { out.push_back(std::move(s)); return; }
        if (is_ws(c)) return;  // the gap before an item is the array's: its item may not add one
        if (c == ']' && f.state == kArrOpen && n.min_items == 0) {
          s.pop_back();
          out.push_back(std::move(s));
          return;
        }
        if (n.max_items >= 0 && f.count >= n.max_items) return;
        {
          ++f.count;
          f.state = kArrAfterValue;
          f.ws = 0;
          Frame v;
          v.type = F::kValue;
          v.node = n.items;
          s.push_back(std::move(v));
          step(std::move(s), c, out, depth + 1);
        }
        return;
      case kArrAfterValue:
        if (ws_ok(f, c, s.size() - 1)) { out.push_back(std::move(s)); return; }
        if (c == ',' && (n.max_items < 0 || f.count < n.max_items)) {
          f.state = kArrAfterComma;
          f.ws = 0;
          out.push_back(std::move(s));
          return;
        }
        if (c == ']' && f.count >= n.min_items) {
          s.pop_back();
          out.push_back(std::move(s));
        }
        return;
    }
  }
};

void dedupe(std::vector<Stack>& v) {
  if (v.size() < 2) return;
  std::vector<Stack> out;
  for (auto& s : v) {
    bool dup = false;
    for (const auto& o : out) dup = dup || o == s;
    if (!dup) out.push_back(std::move(s));
    if (out.size() >= kMaxStacks) break;
  }
  v.swap(out);
}

}  // namespace

struct Matcher::State {
  std::vector<Stack> stacks;
};

namespace {
std::vector<Stack> advance_set(const Grammar& g, const std::vector<Stack>& in, unsigned char c) {
  Stepper st(g);
  std::vector<Stack> out;
  for (const auto& s : in) st.step(s, c, out);
  dedupe(out);
  return out;
}
}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)), st_(std::make_unique<State>()) {
  Frame end;
  end.type = F::kEnd;
  Frame root;
  root.type = F::kValue;
  root.node = g_->root();
  st_->stacks.push_back(Stack{end, root});
}
Matcher::Matcher(const Matcher& o) : g_(o.g_), st_(std::make_unique<State>(*o.st_)) {}
Matcher& Matcher::operator=(const Matcher& o) {
  g_ = o.g_;
  st_ = std::make_unique<State>(*o.st_);
  return *this;
}
Matcher::~Matcher() = default;

bool Matcher::advance(std::string_view bytes) {
  std::vector<Stack> cur = st_->stacks;
  for (char ch : bytes) {
    cur = advance_set(*g_, cur, static_cast<unsigned char>(ch));
    if (cur.empty()) return false;
  }
  st_->stacks = std::move(cur);
  return true;
}

bool Matcher::can_advance(std::string_view bytes) const {
  Matcher copy(*this);
  return copy.advance(bytes);
}

bool Matcher::is_complete() const {
  Stepper st(*g_);
  for (const auto& s : st_->stacks)
    if (st.complete(s)) return true;
  return false;
}

bool Matcher::is_dead() const { return st_->stacks.empty(); }

// ---------------------------------------------------------------- token trie
TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes, const std::vector<bool>& excluded)
    : vocab_size_(static_cast<int64_t>(token_bytes.size())), bytes_(token_bytes) {
  // Build with child maps, then flatten to contiguous edge ranges.
  std::vector<std::map<unsigned char, uint32_t>> kids(1);
  std::vector<std::vector<int32_t>> toks(1);
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    if ((id < excluded.size() && excluded[id]) || token_bytes[id].empty()) continue;
    uint32_t cur = 0;
    for (char ch : token_bytes[id]) {
      unsigned char b = static_cast<unsigned char>(ch);
      auto it = kids[cur].find(b);
      if (it == kids[cur].end()) {
        kids.emplace_back();
        toks.emplace_back();
        uint32_t nn = static_cast<uint32_t>(kids.size() - 1);
        kids[cur][b] = nn;
        cur = nn;
      } else {
        cur = it->second;
      }
    }
    toks[cur].push_back(static_cast<int32_t>(id));
  }
  nodes_.resize(kids.size());
  for (size_t i = 0; i < kids.size(); ++i) {
    nodes_[i].first_child = static_cast<uint32_t>(edges_.size());
    nodes_[i].num_children = static_cast<uint32_t>(kids[i].size());
    nodes_[i].tokens = std::move(toks[i]);
    for (const auto& [b, n] : kids[i]) edges_.push_back({b, n});
  }
  // String fast-path tables (see the header).
  Node plain;
  plain.kind = Kind::kString;
  string_body_.assign(token_bytes.size(), false);
  std::vector<std::string> suffixes(token_bytes.size());
  std::vector<bool> suffix_excluded(token_bytes.size(), true);
  bool any_suffix = false;
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    if ((id < excluded.size() && excluded[id]) || token_bytes[id].empty()) continue;
    Frame f;
    f.type = F::kString;
    const std::string& b = token_bytes[id];
    for (size_t k = 0; k < b.size(); ++k) {
      if (!string_char(f, plain, static_cast<unsigned char>(b[k]))) break;
      if (f.state == 1) {
        if (k + 1 == b.size()) string_close_.push_back(static_cast<int32_t>(id));
        else {
          suffixes[id] = b.substr(k + 1);
          suffix_excluded[id] = false;
          any_suffix = true;
        }
        break;
      }
      if (k + 1 == b.size()) string_body_[id] = true;
    }
  }
  if (any_suffix) {
    auto t = std::shared_ptr<TokenTrie>(new TokenTrie());
    t->vocab_size_ = vocab_size_;
    // Build the suffix trie's nodes directly (its own fast-path tables stay empty).
    std::vector<std::map<unsigned char, uint32_t>> k2(1);
    std::vector<std::vector<int32_t>> t2(1);
    for (size_t id = 0; id < suffixes.size(); ++id) {
      if (suffix_excluded[id]) continue;
      uint32_t cur = 0;
      for (char ch : suffixes[id]) {
        unsigned char b = static_cast<unsigned char>(ch);
        auto it = k2[cur].find(b);
        if (it == k2[cur].end()) {
          k2.emplace_back();
          t2.emplace_back();
          uint32_t nn = static_cast<uint32_t>(k2.size() - 1);
          k2[cur][b] = nn;
          cur = nn;
        } else {
          cur = it->second;
        }
      }
      t2[cur].push_back(static_cast<int32_t>(id));
    }
    t->nodes_.resize(k2.size());
    for (size_t i = 0; i < k2.size(); ++i) {
      t->nodes_[i].first_child = static_cast<uint32_t>(t->edges_.size());
      t->nodes_[i].num_children = static_cast<uint32_t>(k2[i].size());
      t->nodes_[i].tokens = std::move(t2[i]);
      for (const auto& [b, n] : k2[i]) t->edges_.push_back({b, n});
    }
    string_suffix_ = std::move(t);
  }
}

std::shared_ptr<const TokenTrie> TokenTrie::from_tokenizer(const Tokenizer& tok) {
  int64_t v = tok.vocab_size();
  std::vector<std::string> bytes(static_cast<size_t>(v));
  std::vector<bool> excluded(static_cast<size_t>(v), false);
  for (int64_t i = 0; i < v; ++i) {
    bytes[static_cast<size_t>(i)] = tok.token_bytes(static_cast<int32_t>(i));
    excluded[static_cast<size_t>(i)] = tok.is_special(static_cast<int32_t>(i));
  }
  return std::make_shared<TokenTrie>(bytes, excluded);
}

// ---------------------------------------------------------------- constraint
JsonSchemaConstraint::JsonSchemaConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie,
                                           int32_t eos_token_id)
    : trie_(std::move(trie)), matcher_(std::move(grammar)), eos_(eos_token_id) {}

namespace {
void walk(const Grammar& g, const TokenTrie& trie, uint32_t node, const std::vector<Stack>& set, std::vector<bool>& allowed);

void mark(const TokenTrie& trie, uint32_t node, std::vector<bool>& allowed) {
  for (int32_t t : trie.nodes()[node].tokens)
    if (t >= 0 && static_cast<size_t>(t) < allowed.size()) allowed[static_cast<size_t>(t)] = true;
}

// Fast path inside a string value: only the top frame's counters change until the closing quote,
// so walk the subtree carrying that one frame (no stack copies); after the quote, continue with the
// general walk. Most of the vocabulary lies below string states, so this is where masks spend time.
void walk_string(const Grammar& g, const TokenTrie& trie, uint32_t node, const Stack& base, const Frame& f,
                 std::vector<bool>& allowed) {
  const auto& tn = trie.nodes()[node];
  const Node& sn = g.node(f.node);
  for (uint32_t e = tn.first_child; e < tn.first_child + tn.num_children; ++e) {
    const auto& edge = trie.edges()[e];
    Frame nf = f;
    if (!string_char(nf, sn, edge.byte)) continue;
    mark(trie, edge.node, allowed);
    if (nf.state == 1) {
      Stack closed = base;
      closed.pop_back();
      walk(g, trie, edge.node, std::vector<Stack>{std::move(closed)}, allowed);
    } else {
      walk_string(g, trie, edge.node, base, nf, allowed);
    }
  }
}

void walk(const Grammar& g, const TokenTrie& trie, uint32_t node, const std::vector<Stack>& set, std::vector<bool>& allowed) {
  if (set.size() == 1 && !set[0].empty() && set[0].back().type == F::kString) {
    walk_string(g, trie, node, set[0], set[0].back(), allowed);
    return;
  }
  const auto& tn = trie.nodes()[node];
  for (uint32_t e = tn.first_child; e < tn.first_child + tn.num_children; ++e) {
    const auto& edge = trie.edges()[e];
    std::vector<Stack> next = advance_set(g, set, edge.byte);
    if (next.empty()) continue;
    for (int32_t t : trie.nodes()[edge.node].tokens)
      if (t >= 0 && static_cast<size_t>(t) < allowed.size()) allowed[static_cast<size_t>(t)] = true;
    walk(g, trie, edge.node, next, allowed);
  }
}
}  // namespace

void JsonSchemaConstraint::allowed_tokens(std::vector<bool>& allowed) {
  std::fill(allowed.begin(), allowed.end(), false);
  const auto& stacks = matcher_.st_->stacks;
  const Grammar& g = *matcher_.g_;
  bool fast = false;
  if (!finished_ && stacks.size() == 1 && stacks[0].back().type == F::kString &&
      trie_->string_body_tokens().size() == allowed.size()) {
    const Frame& f = stacks[0].back();
    const Node& n = g.node(f.node);
    fast = f.esc == 0 && f.cont == 0 && n.min_len == 0 && n.max_len < 0;
  }
  if (fast) {
    allowed = trie_->string_body_tokens();
    for (int32_t t : trie_->string_close_tokens()) allowed[static_cast<size_t>(t)] = true;
    if (const TokenTrie* suffix = trie_->string_suffix_trie()) {
      Stack closed = stacks[0];
      closed.pop_back();
      walk(g, *suffix, 0, std::vector<Stack>{std::move(closed)}, allowed);
    }
  } else if (!finished_ && !matcher_.is_dead()) {
    walk(g, *trie_, 0, stacks, allowed);
  }
  if (eos_ >= 0 && static_cast<size_t>(eos_) < allowed.size())
    allowed[static_cast<size_t>(eos_)] = matcher_.is_complete() || matcher_.is_dead() || finished_;
}

void JsonSchemaConstraint::accept_token(int32_t token) {
  if (token == eos_) {
    finished_ = true;
    return;
  }
  if (token < 0 || token >= static_cast<int32_t>(trie_->token_bytes().size())) return;
  if (!matcher_.advance(trie_->token_bytes()[static_cast<size_t>(token)])) {
    // The engine sampled outside the mask (a bug upstream): end the document rather than abort.
    matcher_.st_->stacks.clear();
  }
}

bool JsonSchemaConstraint::is_complete() const { return matcher_.is_complete() || matcher_.is_dead(); }

std::unique_ptr<TokenConstraint> JsonSchemaConstraint::clone() const {
  return std::make_unique<JsonSchemaConstraint>(*this);
}

}  // namespace tandem::json_grammar

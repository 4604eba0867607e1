// Grammar-constrained decoding for JSON: a JSON Schema subset compiled into a character-level
// pushdown automaton, run over token byte strings through a precomputed token trie, exposed to the
// engine as a TokenConstraint (text/token_constraint.h). Used for response_format json_object / json_schema and
// for forced tool calls (tool_choice required / named).
//
// Supported: type (string|number|integer|boolean|null|object|array, or a list of them), properties,
// required, additionalProperties (false / true / schema), items, minItems, maxItems, minLength,
// maxLength, enum, const, anyOf (oneOf is treated as anyOf), $ref into #/$defs or #/definitions
// (recursion allowed), and annotations (title, description, default, examples, format, $schema,
// $id, strict). Other constraint keywords (pattern, minimum, allOf, ...) are rejected with an
// error naming them, so a "strict" schema is never silently weakened.
// Output form: properties in any order without duplicates; nothing before or after the root value.
// Whitespace between tokens is bounded by what a JSON formatter writes (JsonWhitespace): a weak
// model that prefers spaces and newlines cannot spend its token budget on them.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "text/token_constraint.h"

namespace tandem {

class Tokenizer;

namespace json_grammar {

// Whitespace allowed in each gap between JSON tokens.
enum class JsonWhitespace {
  // One space (`", "`, `": "`), or one newline followed by an indent of at most
  // kMaxIndentPerLevel spaces or tabs per nesting level (json.dumps(indent=...)).
  kFormatted,
  kNone,  // compact: no whitespace at all
};
inline constexpr int kMaxIndentPerLevel = 4;
// "formatted" | "none" (the server's --json-whitespace flag).
Result<JsonWhitespace> parse_json_whitespace(const std::string& name);

struct Node;  // compiled schema node (json_schema_grammar.cpp)

// A compiled schema: immutable, shared by every request that uses it.
class Grammar {
 public:
  ~Grammar();
  const Node& node(int i) const;
  int root() const { return root_; }
  JsonWhitespace whitespace() const { return whitespace_; }

 private:
  friend Result<std::shared_ptr<const Grammar>> compile(const nlohmann::json& schema, JsonWhitespace ws);
  std::vector<Node> nodes_;
  int root_ = 0;
  JsonWhitespace whitespace_ = JsonWhitespace::kFormatted;
};

Result<std::shared_ptr<const Grammar>> compile(const nlohmann::json& schema,
                                               JsonWhitespace ws = JsonWhitespace::kFormatted);
// response_format json_object: any JSON object.
std::shared_ptr<const Grammar> any_object(JsonWhitespace ws = JsonWhitespace::kFormatted);

// A schema to embed inside a larger one (tool_choice "required" wraps every tool's parameters in one
// schema) whose $refs still mean what they meant in `schema` alone: its "#", "#/$defs/NAME" and
// "#/definitions/NAME" targets are moved into `defs` (the outer schema's "$defs") under names that
// begin with `scope` and its refs rewritten to them. Returns {"$ref": "#/$defs/<scope>"}. Values
// (const, enum, default, examples) are copied as they are.
nlohmann::json embed_schema(const nlohmann::json& schema, const std::string& scope, nlohmann::json& defs);

// Character-level matcher: the set of live parser stacks after the bytes fed so far.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> grammar);
  Matcher(const Matcher&);
  Matcher& operator=(const Matcher&);
  ~Matcher();
  // Feeds bytes; false (and the matcher unchanged) if they cannot continue a valid document.
  bool advance(std::string_view bytes);
  bool can_advance(std::string_view bytes) const;
  bool is_complete() const;   // the bytes so far form a complete valid document
  bool is_dead() const;

  struct State;  // opaque

 private:
  friend class JsonSchemaConstraint;
  std::shared_ptr<const Grammar> g_;
  std::unique_ptr<State> st_;
};

// Token byte strings in a trie (built once per tokenizer; shared by all constraints).
class TokenTrie {
 public:
  // token_bytes[id]; `excluded[id]` tokens (special tokens) are never allowed.
  TokenTrie(const std::vector<std::string>& token_bytes, const std::vector<bool>& excluded);
  static std::shared_ptr<const TokenTrie> from_tokenizer(const Tokenizer& tok);
  int64_t vocab_size() const { return vocab_size_; }
  size_t node_count() const { return nodes_.size(); }

  struct TrieNode {
    uint32_t first_child = 0;   // index into edges_
    uint32_t num_children = 0;
    std::vector<int32_t> tokens;  // tokens ending here
  };
  struct Edge {
    unsigned char byte;
    uint32_t node;
  };
  const std::vector<TrieNode>& nodes() const { return nodes_; }
  const std::vector<Edge>& edges() const { return edges_; }
  const std::vector<std::string>& token_bytes() const { return bytes_; }

  // Precomputed for the commonest state, inside a string without length limits and with no escape
  // or UTF-8 sequence pending: tokens that stay inside the string, tokens that end with its closing
  // quote, and a trie of what follows the quote for tokens that go on past it.
  const std::vector<bool>& string_body_tokens() const { return string_body_; }
  const std::vector<int32_t>& string_close_tokens() const { return string_close_; }
  const TokenTrie* string_suffix_trie() const { return string_suffix_.get(); }

 private:
  TokenTrie() = default;
  std::vector<bool> string_body_;
  std::vector<int32_t> string_close_;
  std::shared_ptr<const TokenTrie> string_suffix_;
  int64_t vocab_size_ = 0;
  std::vector<TrieNode> nodes_;
  std::vector<Edge> edges_;
  std::vector<std::string> bytes_;
};

class JsonSchemaConstraint final : public TokenConstraint {
 public:
  JsonSchemaConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie, int32_t eos_token_id);
  void allowed_tokens(std::vector<bool>& allowed) override;
  void accept_token(int32_t token) override;
  bool is_complete() const override;
  std::unique_ptr<TokenConstraint> clone() const override;
  const Matcher& matcher() const { return matcher_; }

 private:
  std::shared_ptr<const TokenTrie> trie_;
  Matcher matcher_;
  int32_t eos_;
  bool finished_ = false;
};

}  // namespace json_grammar
}  // namespace tandem

// TokenConstraint: the interface between a grammar (src/text/json_schema_grammar.h) and the
// engine's sampler, which only asks it which tokens may come next. It lives in text/ so the
// grammar depends on nothing above it; engine.h re-exports it for requests.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace tandem {

// Grammar constraint on the output (JSON schema / json_object), compiled by the server's grammar
// module; the engine only asks it which tokens are allowed next.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets allowed[id] for every token id allowed next (allowed.size() == vocab size).
  virtual void allowed_tokens(std::vector<bool>& allowed) = 0;
  virtual void accept_token(int32_t token) = 0;
  virtual bool is_complete() const = 0;  // EOS is allowed only when complete
  virtual std::unique_ptr<TokenConstraint> clone() const = 0;
};

}  // namespace tandem

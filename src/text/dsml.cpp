// DSML output parser: the incremental state machine turning model output into reasoning,
// content and tool-call deltas (a byte-driven state machine over a small unconsumed buffer).
#include "text/dsml.h"

#include <algorithm>
#include <random>

#include "common/log.h"

namespace tandem {

using nlohmann::ordered_json;

// ============================================================================================
// Incremental parser
// ============================================================================================

namespace {

constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke name=\"";
constexpr std::string_view kInvokeClose = "</｜DSML｜invoke>";
constexpr std::string_view kParamOpen = "<｜DSML｜parameter name=\"";
constexpr std::string_view kParamClose = "</｜DSML｜parameter>";
constexpr std::string_view kBlockClose = "</｜DSML｜tool_calls>";
constexpr std::string_view kStringAttr = "\" string=\"";
constexpr std::string_view kFlagTrue = "true\">";
constexpr std::string_view kFlagFalse = "false\">";
constexpr size_t kMaxAttrBytes = 1024;  // tool / parameter names longer than this are malformed

// Length of the longest suffix of `s` that is a proper prefix of `pat`.
size_t partial_suffix(std::string_view s, std::string_view pat) {
  size_t k = std::min(s.size(), pat.size() - 1);
  for (; k > 0; --k) {
    if (s.substr(s.size() - k) == pat.substr(0, k)) return k;
  }
  return 0;
}

// Bytes at the end of `s` that begin a UTF-8 character whose remaining bytes have not arrived.
size_t incomplete_utf8_tail(std::string_view s) {
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    unsigned char c = static_cast<unsigned char>(s[s.size() - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > k ? k : 0;
  }
  return 0;
}

bool is_valid_utf8(std::string_view s);

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

bool valid_attr(std::string_view name) {
  if (name.empty() || name.size() > kMaxAttrBytes) return false;
  for (char c : name) {
    if (c == '"' || c == '<' || c == '>' || c == '\n' || c == '\r') return false;
  }
  return name.find(dsv4::kDsml) == std::string_view::npos && is_valid_utf8(name);
}

// Matching `buf` against alternatives: index of the one it starts with, -1 if it may still become
// one (a proper prefix of some), -2 if it cannot.
int match_alternatives(std::string_view buf, std::initializer_list<std::string_view> alts) {
  int i = 0;
  bool maybe = false;
  for (std::string_view a : alts) {
    if (buf.substr(0, a.size()) == a) return i;
    if (buf.size() < a.size() && a.substr(0, buf.size()) == buf) maybe = true;
    ++i;
  }
  return maybe ? -1 : -2;
}

// Copy of `s` with each maximal ill-formed UTF-8 subpart replaced by U+FFFD, so that arguments
// strings stay valid JSON whatever bytes the model produced.
std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    size_t j = 1;
    if (len > 0) {
      for (; j < len && i + j < s.size(); ++j) {
        unsigned char b = static_cast<unsigned char>(s[i + j]);
        if (j == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
      }
    }
    if (len > 0 && j == len) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += j;
    }
  }
  return out;
}

bool is_valid_utf8(std::string_view s) { return utf8_lossy(s) == s; }

std::string escaped_fragment(std::string_view raw) {
  std::string quoted;
  append_python_json_string(quoted, utf8_lossy(raw));
  return quoted.substr(1, quoted.size() - 2);
}

std::string random_call_id() {
  static constexpr char kAlnum[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  std::uniform_int_distribution<int> pick(0, 61);
  for (int i = 0; i < 24; ++i) id.push_back(kAlnum[pick(rng)]);
  return id;
}

}  // namespace

DsmlStreamParser::DsmlStreamParser(DsmlParserOptions options)
    : options_(std::move(options)), state_(options_.thinking ? State::kReasoning : State::kContent) {
  if (!options_.make_id) options_.make_id = random_call_id;
}

void DsmlStreamParser::warn(std::string message) {
  TLOG_WARN("dsml", "{}", message);
  warnings_.push_back(std::move(message));
}

void DsmlStreamParser::emit_text(std::vector<DsmlDelta>& out, DsmlDeltaKind kind, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind) {
    out.back().text += text;
    return;
  }
  DsmlDelta d;
  d.kind = kind;
  d.text = std::string(text);
  out.push_back(std::move(d));
}

void DsmlStreamParser::emit_args(std::vector<DsmlDelta>& out, std::string_view text) {
  if (text.empty()) return;
  int index = calls_started_ - 1;
  if (!out.empty() && out.back().kind == DsmlDeltaKind::kToolCallArgs && out.back().tool_index == index) {
    out.back().text += text;
    return;
  }
  DsmlDelta d;
  d.kind = DsmlDeltaKind::kToolCallArgs;
  d.tool_index = index;
  d.text = std::string(text);
  out.push_back(std::move(d));
}

void DsmlStreamParser::consume(size_t n) {
  switch (state_) {
    case State::kBlockOpen: case State::kBetween: case State::kInvokeName: case State::kParamName:
    case State::kParamFlag: case State::kStringValue: case State::kJsonValue:
      if (calls_started_ == 0) {
        block_raw_.append(buf_, 0, n);
      } else {
        elem_raw_.append(buf_, 0, n);
      }
      break;
    default: break;
  }
  buf_.erase(0, n);
}

void DsmlStreamParser::close_open_call(std::vector<DsmlDelta>& out) {
  if (!in_invoke_) return;
  if (state_ == State::kStringValue) emit_args(out, "\"");
  emit_args(out, "}");
  in_invoke_ = false;
}

// Markup that cannot be parsed: degrade to content (see the header for the rules).
void DsmlStreamParser::fail(std::vector<DsmlDelta>& out, const std::string& why) {
  std::string rest;
  if (calls_started_ == 0) {
    warn("malformed tool-call block, kept as content: " + why);
    rest = block_raw_ + buf_;
    block_raw_.clear();
  } else {
    warn(fmt::format("malformed tool call #{}, rest kept as content: {}", calls_started_ - 1, why));
    close_open_call(out);
    rest = elem_raw_ + buf_;
  }
  elem_raw_.clear();
  buf_ = std::move(rest);
  state_ = State::kRawContent;
}

// Reasoning or content: find "</think>" (reasoning only) or the tool-call tag; emit what cannot be
// part of either, holding back a possible partial tag and up to two '\n' before it.
bool DsmlStreamParser::step_text(std::vector<DsmlDelta>& out, bool reasoning) {
  const DsmlDeltaKind kind = reasoning ? DsmlDeltaKind::kReasoning : DsmlDeltaKind::kContent;
  std::string_view b = buf_;
  size_t think_pos = reasoning ? b.find(dsv4::kThinkEnd) : std::string_view::npos;
  size_t tag_pos = b.find(dsv4::kToolCallsTag);
  if (think_pos != std::string_view::npos && (tag_pos == std::string_view::npos || think_pos < tag_pos)) {
    emit_text(out, kind, b.substr(0, think_pos));
    buf_.erase(0, think_pos + dsv4::kThinkEnd.size());
    state_ = State::kContent;
    return true;
  }
  if (tag_pos != std::string_view::npos) {
    size_t nl = 0;
    while (nl < 2 && nl < tag_pos && b[tag_pos - nl - 1] == '\n') ++nl;
    if (reasoning) warn("tool-call block inside reasoning (no </think> before it)");
    emit_text(out, kind, b.substr(0, tag_pos - nl));
    block_raw_.assign(b.substr(tag_pos - nl, nl + dsv4::kToolCallsTag.size()));
    buf_.erase(0, tag_pos + dsv4::kToolCallsTag.size());
    state_ = State::kBlockOpen;
    return true;
  }
  if (finishing_) {
    emit_text(out, kind, b);
    buf_.clear();
    return false;
  }
  size_t hold = partial_suffix(b, dsv4::kToolCallsTag);
  for (int i = 0; i < 2 && hold < b.size() && b[b.size() - hold - 1] == '\n'; ++i) ++hold;
  if (reasoning) hold = std::max(hold, partial_suffix(b, dsv4::kThinkEnd));
  size_t safe = b.size() - hold;
  safe -= incomplete_utf8_tail(b.substr(0, safe));
  emit_text(out, kind, b.substr(0, safe));
  buf_.erase(0, safe);
  return false;
}

bool DsmlStreamParser::step(std::vector<DsmlDelta>& out) {
  switch (state_) {
    case State::kReasoning: return step_text(out, true);
    case State::kContent: return step_text(out, false);

    case State::kBlockOpen:
      if (buf_.empty()) return false;
      if (buf_[0] != '>') {
        fail(out, "expected '>' after <｜DSML｜tool_calls");
        return true;
      }
      consume(1);
      state_ = State::kBetween;
      return true;

    case State::kBetween: {
      size_t ws = 0;
      while (ws < buf_.size() && is_space(buf_[ws])) ++ws;
      consume(ws);
      elem_raw_.clear();
      if (buf_.empty()) return false;
      int m = in_invoke_ ? match_alternatives(buf_, {kParamOpen, kInvokeClose})
                         : match_alternatives(buf_, {kInvokeOpen, kBlockClose});
      if (m == -1) return false;
      if (m == -2) {
        fail(out, in_invoke_ ? "expected <｜DSML｜parameter or </｜DSML｜invoke>"
                             : "expected <｜DSML｜invoke or </｜DSML｜tool_calls>");
        return true;
      }
      if (in_invoke_ && m == 0) {
        consume(kParamOpen.size());
        state_ = State::kParamName;
      } else if (in_invoke_) {
        consume(kInvokeClose.size());
        emit_args(out, "}");
        in_invoke_ = false;
      } else if (m == 0) {
        consume(kInvokeOpen.size());
        state_ = State::kInvokeName;
      } else {
        consume(kBlockClose.size());
        if (calls_started_ == 0) warn("empty tool-call block dropped");
        block_raw_.clear();
        state_ = State::kAfterBlock;
      }
      return true;
    }

    case State::kInvokeName: {
      size_t p = buf_.find("\">");
      if (p == std::string::npos) {
        if (buf_.size() > kMaxAttrBytes + 1) fail(out, "tool name too long or unterminated");
        return state_ == State::kRawContent;
      }
      std::string name = buf_.substr(0, p);
      if (!valid_attr(name)) {
        fail(out, "invalid tool name");
        return true;
      }
      consume(p + 2);
      ++calls_started_;
      block_raw_.clear();
      DsmlDelta d;
      d.kind = DsmlDeltaKind::kToolCallStart;
      d.tool_index = calls_started_ - 1;
      d.id = options_.make_id();
      d.name = std::move(name);
      out.push_back(std::move(d));
      emit_args(out, "{");
      in_invoke_ = true;
      params_in_call_ = 0;
      param_names_.clear();
      state_ = State::kBetween;
      return true;
    }

    case State::kParamName: {
      size_t q = buf_.find('"');
      if (q == std::string::npos) {
        if (buf_.size() > kMaxAttrBytes) fail(out, "parameter name too long or unterminated");
        return state_ == State::kRawContent;
      }
      std::string_view after = std::string_view(buf_).substr(q);
      if (after.substr(0, kStringAttr.size()) != kStringAttr) {
        if (after.size() < kStringAttr.size() && kStringAttr.substr(0, after.size()) == after) return false;
        fail(out, "expected '\" string=\"' after the parameter name");
        return true;
      }
      std::string name = buf_.substr(0, q);
      if (!valid_attr(name)) {
        fail(out, "invalid parameter name");
        return true;
      }
      if (std::find(param_names_.begin(), param_names_.end(), name) != param_names_.end()) {
        fail(out, "duplicate parameter '" + name + "'");
        return true;
      }
      consume(q + kStringAttr.size());
      param_name_ = std::move(name);
      state_ = State::kParamFlag;
      return true;
    }

    case State::kParamFlag: {
      int m = match_alternatives(buf_, {kFlagTrue, kFlagFalse});
      if (m == -1) return false;
      if (m == -2) {
        fail(out, "parameter string flag must be \"true\" or \"false\"");
        return true;
      }
      consume(m == 0 ? kFlagTrue.size() : kFlagFalse.size());
      if (m == 0) {
        std::string head = params_in_call_ > 0 ? ", " : "";
        append_python_json_string(head, param_name_);
        head += ": \"";
        emit_args(out, head);
        ++params_in_call_;
        param_names_.push_back(param_name_);
        state_ = State::kStringValue;
      } else {
        json_scan_from_ = 0;
        state_ = State::kJsonValue;
      }
      return true;
    }

    case State::kStringValue: {
      size_t p = buf_.find(kParamClose);
      if (p != std::string::npos) {
        emit_args(out, escaped_fragment(std::string_view(buf_).substr(0, p)) + "\"");
        consume(p + kParamClose.size());
        state_ = State::kBetween;
        return true;
      }
      if (finishing_) return false;
      std::string_view b = buf_;
      size_t safe = b.size() - partial_suffix(b, kParamClose);
      safe -= incomplete_utf8_tail(b.substr(0, safe));
      emit_args(out, escaped_fragment(b.substr(0, safe)));
      consume(safe);
      return false;
    }

    case State::kJsonValue: {
      // A JSON value is only emitted once complete (it must validate); resume the search for its
      // closing tag where the last one stopped so byte-sized pushes stay linear.
      size_t p = buf_.find(kParamClose, json_scan_from_);
      if (p == std::string::npos) {
        json_scan_from_ = buf_.size() >= kParamClose.size() ? buf_.size() - kParamClose.size() + 1 : 0;
        return false;
      }
      std::string_view raw = std::string_view(buf_).substr(0, p);
      if (!nlohmann::json::accept(raw)) {
        fail(out, "parameter '" + param_name_ + "' has string=\"false\" but its value is not JSON");
        return true;
      }
      std::string frag = params_in_call_ > 0 ? ", " : "";
      append_python_json_string(frag, param_name_);
      frag += ": ";
      frag += raw;  // kept verbatim, as the official parser does
      emit_args(out, frag);
      ++params_in_call_;
      param_names_.push_back(param_name_);
      consume(p + kParamClose.size());
      state_ = State::kBetween;
      return true;
    }

    case State::kAfterBlock: {
      size_t ws = 0;
      while (ws < buf_.size() && is_space(buf_[ws])) ++ws;
      after_block_ws_.append(buf_, 0, ws);
      buf_.erase(0, ws);
      if (buf_.empty()) return false;
      warn("text after </｜DSML｜tool_calls> kept as content");
      buf_.insert(0, after_block_ws_);
      after_block_ws_.clear();
      state_ = State::kRawContent;
      return true;
    }

    case State::kRawContent: {
      std::string_view b = buf_;
      size_t safe = finishing_ ? b.size() : b.size() - incomplete_utf8_tail(b);
      emit_text(out, DsmlDeltaKind::kContent, b.substr(0, safe));
      buf_.erase(0, safe);
      return false;
    }

    case State::kDone:
      buf_.clear();
      return false;
  }
  return false;
}

void DsmlStreamParser::feed(std::string_view text, std::vector<DsmlDelta>& out) {
  buf_.append(text);
  while (step(out)) {
  }
}

std::vector<DsmlDelta> DsmlStreamParser::push(std::string_view chunk) {
  std::vector<DsmlDelta> out;
  if (state_ == State::kDone) return out;
  if (saw_eos_) {
    if (!chunk.empty() && !warned_after_eos_) {
      warned_after_eos_ = true;
      warn("text after the EOS token ignored");
    }
    return out;
  }
  std::string in = eos_pending_;
  in.append(chunk);
  eos_pending_.clear();
  size_t p = in.find(dsv4::kEos);
  if (p != std::string::npos) {
    feed(std::string_view(in).substr(0, p), out);
    saw_eos_ = true;
    if (p + dsv4::kEos.size() < in.size()) {
      warned_after_eos_ = true;
      warn("text after the EOS token ignored");
    }
    return out;
  }
  size_t hold = partial_suffix(in, dsv4::kEos);
  feed(std::string_view(in).substr(0, in.size() - hold), out);
  eos_pending_ = in.substr(in.size() - hold);
  return out;
}

std::vector<DsmlDelta> DsmlStreamParser::finish() {
  std::vector<DsmlDelta> out;
  if (state_ == State::kDone) return out;
  std::string tail = std::move(eos_pending_);
  eos_pending_.clear();
  finishing_ = true;
  feed(tail, out);
  switch (state_) {
    case State::kBlockOpen: case State::kBetween: case State::kInvokeName: case State::kParamName:
    case State::kParamFlag: case State::kStringValue: case State::kJsonValue:
      if (calls_started_ == 0) {
        warn("output ended inside a tool-call block, kept as content");
        emit_text(out, DsmlDeltaKind::kContent, block_raw_ + buf_);
      } else if (in_invoke_ || state_ != State::kBetween) {
        warn(fmt::format("output ended inside tool call #{}; closed it", calls_started_ - 1));
        if (state_ == State::kStringValue) emit_args(out, escaped_fragment(buf_));
        close_open_call(out);
      } else {
        warn("output ended before </｜DSML｜tool_calls>");
      }
      break;
    default: break;
  }
  buf_.clear();
  block_raw_.clear();
  elem_raw_.clear();
  state_ = State::kDone;
  return out;
}

void apply_dsml_deltas(const std::vector<DsmlDelta>& deltas, DsmlParseResult& result) {
  for (const DsmlDelta& d : deltas) {
    switch (d.kind) {
      case DsmlDeltaKind::kReasoning: result.reasoning_content += d.text; break;
      case DsmlDeltaKind::kContent: result.content += d.text; break;
      case DsmlDeltaKind::kToolCallStart:
        if (d.tool_index >= 0 && static_cast<size_t>(d.tool_index) >= result.tool_calls.size()) {
          result.tool_calls.resize(d.tool_index + 1);
        }
        if (d.tool_index >= 0) {
          result.tool_calls[d.tool_index].id = d.id;
          result.tool_calls[d.tool_index].name = d.name;
        }
        break;
      case DsmlDeltaKind::kToolCallArgs:
        if (d.tool_index >= 0 && static_cast<size_t>(d.tool_index) < result.tool_calls.size()) {
          result.tool_calls[d.tool_index].arguments += d.text;
        }
        break;
    }
  }
}

DsmlParseResult parse_dsml_completion(std::string_view text, const DsmlParserOptions& options) {
  DsmlStreamParser parser(options);
  DsmlParseResult result;
  apply_dsml_deltas(parser.push(text), result);
  apply_dsml_deltas(parser.finish(), result);
  result.warnings = parser.warnings();
  return result;
}

nlohmann::json dsml_tool_calls_to_openai(const std::vector<DsmlToolCall>& calls) {
  nlohmann::json arr = nlohmann::json::array();
  for (const DsmlToolCall& c : calls) {
    arr.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return arr;
}

}  // namespace tandem

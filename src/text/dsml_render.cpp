// DSML rendering side: the Python-compatible JSON writer (json.dumps(ensure_ascii=False)) and
// OpenAI tool calls -> DSML invoke elements, shared by the prompt encoder and the parser's tests.
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "text/dsml.h"

namespace tandem {

using nlohmann::ordered_json;

// ============================================================================================
// Python-compatible JSON writer
// ============================================================================================

void append_python_json_string(std::string& out, std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (char ch : text) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 15]);
        } else {
          out.push_back(ch);  // UTF-8 bytes pass through (ensure_ascii=False)
        }
    }
  }
  out.push_back('"');
}

namespace {

void append_float(std::string& out, double d) {
  // Python's float repr: the shortest round-trip digits, written positionally when the decimal
  // exponent is in [-4, 16) and as d.ddde+XX otherwise; NaN / Infinity spelled out.
  if (std::isnan(d)) {
    out += "NaN";
    return;
  }
  if (std::isinf(d)) {
    out += d < 0 ? "-Infinity" : "Infinity";
    return;
  }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, res.ptr - buf);  // "-1.2345e+17"
  bool neg = !sci.empty() && sci[0] == '-';
  if (neg) sci.remove_prefix(1);
  size_t epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos)) {
    if (c != '.') digits.push_back(c);
  }
  int exp10 = std::atoi(std::string(sci.substr(epos + 1)).c_str());
  if (neg) out.push_back('-');
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exp10 - 1), '0');
      out += digits;
    } else {
      size_t int_len = static_cast<size_t>(exp10) + 1;
      if (digits.size() <= int_len) {
        out += digits;
        out.append(int_len - digits.size(), '0');
        out += ".0";
      } else {
        out.append(digits, 0, int_len);
        out.push_back('.');
        out.append(digits, int_len, std::string::npos);
      }
    }
  } else {
    out.push_back(digits[0]);
    if (digits.size() > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    out.push_back('e');
    out.push_back(exp10 < 0 ? '-' : '+');
    int a = exp10 < 0 ? -exp10 : exp10;
    if (a < 10) out.push_back('0');
    out += std::to_string(a);
  }
}

void append_json(std::string& out, const ordered_json& v, size_t depth = 0) {
  if (depth > kMaxJsonNesting) {
    out += "null";
    return;
  }
  switch (v.type()) {
    case ordered_json::value_t::null: out += "null"; break;
    case ordered_json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case ordered_json::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case ordered_json::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case ordered_json::value_t::number_float: append_float(out, v.get<double>()); break;
    case ordered_json::value_t::string: append_python_json_string(out, v.get_ref<const std::string&>()); break;
    case ordered_json::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        append_json(out, e, depth + 1);
      }
      out.push_back(']');
      break;
    }
    case ordered_json::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        append_python_json_string(out, it.key());
        out += ": ";
        append_json(out, it.value(), depth + 1);
      }
      out.push_back('}');
      break;
    }
    default: out += "null"; break;  // binary / discarded: not produced by the JSON parser
  }
}

}  // namespace

namespace {
template <typename Json>
bool nesting_exceeds(const Json& value, size_t limit) {
  // Explicit stack: the input may be nested far deeper than the C++ stack allows.
  std::vector<std::pair<const Json*, size_t>> stack{{&value, 0}};
  while (!stack.empty()) {
    auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    if (depth >= limit) return true;
    for (const auto& child : *v) stack.emplace_back(&child, depth + 1);
  }
  return false;
}
}  // namespace

bool json_nesting_exceeds(const ordered_json& value, size_t limit) { return nesting_exceeds(value, limit); }
bool json_nesting_exceeds(const nlohmann::json& value, size_t limit) { return nesting_exceeds(value, limit); }

std::string python_json_dumps(const ordered_json& value) {
  std::string out;
  append_json(out, value);
  return out;
}

// ============================================================================================
// Rendering OpenAI tool calls as DSML
// ============================================================================================

Result<std::string> render_dsml_invoke(const ordered_json& tool_call, const std::string& path) {
  if (!tool_call.is_object()) return invalid_argument("{}: must be an object", path);
  auto fit = tool_call.find("function");
  if (fit == tool_call.end() || !fit->is_object()) {
    return invalid_argument("{}.function: must be an object with name and arguments", path);
  }
  const ordered_json& fn = *fit;
  auto nit = fn.find("name");
  if (nit == fn.end() || !nit->is_string()) return invalid_argument("{}.function.name: must be a string", path);
  auto ait = fn.find("arguments");
  if (ait == fn.end()) return invalid_argument("{}.function.arguments: missing", path);

  ordered_json args;
  if (ait->is_string()) {
    const std::string& text = ait->get_ref<const std::string&>();
    args = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    // Not JSON: the official encoder keeps the raw text as one parameter named "arguments".
    if (args.is_discarded()) args = ordered_json::object({{"arguments", text}});
  } else if (ait->is_object()) {
    args = *ait;  // already decoded (not OpenAI wire form, but unambiguous)
  } else {
    return invalid_argument("{}.function.arguments: must be a JSON string", path);
  }
  if (!args.is_object()) {
    return invalid_argument("{}.function.arguments: must encode a JSON object, got {}", path,
                            args.type_name());
  }
  if (json_nesting_exceeds(args)) {
    return invalid_argument("{}.function.arguments: nested deeper than {} levels", path, kMaxJsonNesting);
  }

  std::string out = "<｜DSML｜invoke name=\"";
  out += nit->get_ref<const std::string&>();
  out += "\">\n";
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) out += "\n";
    first = false;
    out += "<｜DSML｜parameter name=\"";
    out += it.key();
    if (it.value().is_string()) {
      out += "\" string=\"true\">";
      out += it.value().get_ref<const std::string&>();
    } else {
      out += "\" string=\"false\">";
      append_json(out, it.value());
    }
    out += "</｜DSML｜parameter>";
  }
  out += "\n</｜DSML｜invoke>";
  return out;
}

Result<std::string> render_dsml_tool_calls(const ordered_json& tool_calls, const std::string& path) {
  if (!tool_calls.is_array()) return invalid_argument("{}: must be an array", path);
  std::string out = "\n\n<｜DSML｜tool_calls>\n";
  for (size_t i = 0; i < tool_calls.size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(std::string invoke,
                            render_dsml_invoke(tool_calls[i], fmt::format("{}[{}]", path, i)));
    if (i > 0) out += "\n";
    out += invoke;
  }
  out += "\n</｜DSML｜tool_calls>";
  return out;
}

}  // namespace tandem

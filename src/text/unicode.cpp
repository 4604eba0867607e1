// UTF-8 and byte-level helpers (see unicode.h).
#include "text/unicode.h"

namespace tandem::text {

namespace {

struct ByteMaps {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 512> to_byte{};  // every byte-level code point is < 0x144
  ByteMaps() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = printable ? char32_t(b) : char32_t(256 + n++);
      to_byte[to_cp[b]] = int16_t(b);
    }
  }
};

const ByteMaps& maps() {
  static const ByteMaps m;
  return m;
}

}  // namespace

const std::array<char32_t, 256>& byte_to_unicode() { return maps().to_cp; }

int unicode_to_byte(char32_t cp) { return cp < 512 ? maps().to_byte[cp] : -1; }

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Valid range of the second byte given the lead byte (Unicode Table 3-7); 0,0 if lead is invalid.
inline void second_byte_range(unsigned char lead, unsigned char* lo, unsigned char* hi, int* len) {
  *lo = 0x80;
  *hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    *len = 2;
  } else if (lead == 0xE0) {
    *len = 3;
    *lo = 0xA0;
  } else if (lead == 0xED) {
    *len = 3;
    *hi = 0x9F;
  } else if (lead >= 0xE1 && lead <= 0xEF) {
    *len = 3;
  } else if (lead == 0xF0) {
    *len = 4;
    *lo = 0x90;
  } else if (lead == 0xF4) {
    *len = 4;
    *hi = 0x8F;
  } else if (lead >= 0xF1 && lead <= 0xF3) {
    *len = 4;
  } else {
    *len = 0;
  }
}

// Number of leading bytes of s[i..] that form a valid prefix of a sequence (0 if the lead byte is
// invalid), and the full sequence length via *need.
size_t valid_prefix(std::string_view s, size_t i, int* need) {
  unsigned char lead = static_cast<unsigned char>(s[i]);
  if (lead < 0x80) {
    *need = 1;
    return 1;
  }
  unsigned char lo, hi;
  second_byte_range(lead, &lo, &hi, need);
  if (*need == 0) return 0;
  size_t k = 1;
  while (k < size_t(*need) && i + k < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i + k]);
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) break;
    ++k;
  }
  return k;
}

}  // namespace

size_t decode_utf8(std::string_view s, size_t i, char32_t* cp) {
  int need = 0;
  size_t k = valid_prefix(s, i, &need);
  if (need == 0 || k != size_t(need)) return 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + i);
  switch (need) {
    case 1: *cp = p[0]; break;
    case 2: *cp = char32_t(p[0] & 0x1F) << 6 | (p[1] & 0x3F); break;
    case 3: *cp = char32_t(p[0] & 0x0F) << 12 | char32_t(p[1] & 0x3F) << 6 | (p[2] & 0x3F); break;
    default:
      *cp = char32_t(p[0] & 0x07) << 18 | char32_t(p[1] & 0x3F) << 12 | char32_t(p[2] & 0x3F) << 6 |
            (p[3] & 0x3F);
  }
  return size_t(need);
}

size_t invalid_subpart_length(std::string_view s, size_t i) {
  int need = 0;
  size_t k = valid_prefix(s, i, &need);
  return k == 0 ? 1 : k;
}

bool is_incomplete_utf8_prefix(std::string_view s, size_t i) {
  int need = 0;
  size_t k = valid_prefix(s, i, &need);
  return need > 1 && k < size_t(need) && i + k == s.size();
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c < 0x80) {
      out.push_back(char(c));
      ++i;
      continue;
    }
    char32_t cp;
    size_t n = decode_utf8(bytes, i, &cp);
    if (n) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      append_utf8(out, kReplacementChar);
      i += invalid_subpart_length(bytes, i);
    }
  }
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    char32_t cp;
    size_t n = decode_utf8(bytes, i, &cp);
    if (!n) return false;
    i += n;
  }
  return true;
}

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool byte_level_to_bytes(std::string_view spelled, std::string* out) {
  out->clear();
  size_t i = 0;
  while (i < spelled.size()) {
    char32_t cp;
    size_t n = decode_utf8(spelled, i, &cp);
    if (!n) return false;
    int b = unicode_to_byte(cp);
    if (b < 0) return false;
    out->push_back(char(b));
    i += n;
  }
  return true;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  const auto& m = byte_to_unicode();
  for (unsigned char c : bytes) append_utf8(out, m[c]);
  return out;
}

}  // namespace tandem::text

// UTF-8 helpers for the tokenizer: the GPT-2 byte<->unicode map that byte-level BPE spells tokens
// with, UTF-8 encode/decode, lossy repair (each maximal invalid subpart -> U+FFFD, as Rust's
// from_utf8_lossy and Python's errors="replace" do), and the few character classes HF uses.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::text {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// byte -> code point of its byte-level spelling (printable bytes map to themselves, the rest to
// U+0100 + n in byte order), and the inverse (-1 for code points that are no byte's spelling).
const std::array<char32_t, 256>& byte_to_unicode();
int unicode_to_byte(char32_t cp);

void append_utf8(std::string& out, char32_t cp);

// Decodes one code point at s[i]. Returns its length in bytes (1..4), or 0 if s[i..] does not start
// with a valid, complete UTF-8 sequence.
size_t decode_utf8(std::string_view s, size_t i, char32_t* cp);

// Length of the maximal subpart of an ill-formed sequence starting at s[i] (Unicode ch. 3, U+FFFD
// substitution of maximal subparts): the longest prefix that could still begin a valid sequence,
// at least 1. Only meaningful when decode_utf8(s, i) == 0.
size_t invalid_subpart_length(std::string_view s, size_t i);

// True if s[i..] is a proper prefix of some valid UTF-8 sequence (incomplete, not yet invalid).
bool is_incomplete_utf8_prefix(std::string_view s, size_t i);

// Copy of `bytes` with every maximal invalid subpart replaced by U+FFFD.
std::string utf8_lossy(std::string_view bytes);
bool is_valid_utf8(std::string_view bytes);

// Rust char::is_whitespace (Unicode White_Space).
bool is_unicode_whitespace(char32_t cp);

// Bytes of a byte-level spelled token ("Ġhello" -> " hello"). Returns false if some code point is
// not in the byte map (then `out` is unspecified).
bool byte_level_to_bytes(std::string_view spelled, std::string* out);
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace tandem::text

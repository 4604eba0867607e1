// SHA-256 via OpenSSL's EVP interface, streaming so multi-GB shards need no extra memory.
#include "io/sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <memory>
#include <vector>

namespace tandem {
namespace {

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

std::string to_hex(const unsigned char* d, unsigned n) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < n; ++i) {
    s += kHex[d[i] >> 4];
    s += kHex[d[i] & 15];
  }
  return s;
}

}  // namespace

Result<std::string> sha256_file_hex(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return not_found("{}: cannot open for hashing", path);
  std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return make_error(StatusCode::kInternal, "sha256: EVP init failed");
  }
  std::vector<unsigned char> buf(4u << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) {
    if (EVP_DigestUpdate(ctx.get(), buf.data(), n) != 1) {
      return make_error(StatusCode::kInternal, "sha256: EVP update failed");
    }
  }
  if (std::ferror(f.get())) return data_loss("{}: read error while hashing", path);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest, &len) != 1) {
    return make_error(StatusCode::kInternal, "sha256: EVP final failed");
  }
  return to_hex(digest, len);
}

std::string sha256_hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(), nullptr);
  return to_hex(digest, len);
}

}  // namespace tandem

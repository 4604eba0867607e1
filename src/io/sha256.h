// Streaming SHA-256 of files (OpenSSL EVP), for checkpoint manifests in `sha256sum` format.
#pragma once

#include <string>

#include "common/status.h"

namespace tandem {

// Lower-case hex digest of the file's bytes, read in 4 MiB chunks.
Result<std::string> sha256_file_hex(const std::string& path);
// Digest of a byte string (tests, small files).
std::string sha256_hex(const std::string& bytes);

}  // namespace tandem

// libFuzzer target: any byte string fed to the safetensors header validator must yield a Status,
// never a crash, an out-of-bounds read or an uncaught exception.
#include <cstddef>
#include <cstdint>
#include <span>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::Status st = tandem::SafetensorsFile::validate_bytes(std::span<const uint8_t>(data, size),
                                                              "fuzz.safetensors");
  (void)st;
  return 0;
}

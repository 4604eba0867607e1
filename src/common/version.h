// Version of this build (also served at GET /version).
#pragma once

namespace tandem {
inline const char* version_string() { return "0.1.0"; }
}  // namespace tandem

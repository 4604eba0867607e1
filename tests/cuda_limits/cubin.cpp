// Fatbin and cubin reading for the kernel-limits check (cubin.h). Layouts as nvcc 13.0 writes them:
// - a fatbin is a sequence of containers {u32 magic 0xBA55ED50, u16 version, u16 header size,
//   u64 size} each followed by entries {u16 kind (1 PTX, 2 ELF), u16, u32 header size,
//   u64 padded payload size, ..., u32 SM at +28, ..., u64 flags at +40 (0x2000: compressed)};
// - a cubin is an ELF64 file whose header flags carry the SM in bits 8-15; entry kernels are
//   STT_FUNC symbols with st_other bit 0x10; a kernel's static shared memory is the size of its
//   NOBITS section `.nv.shared.<kernel>`, which on sm_90 and later starts with the reserved system
//   area whose size the weak symbol `.nv.reservedSmem.cap` gives; `.note.nv.tkinfo` records the
//   ptxas command line ("-arch sm_120 -m 64").
#include "cuda_limits/cubin.h"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>

namespace tandem::cubin {
namespace {

constexpr uint32_t kFatbinMagic = 0xBA55ED50u;
constexpr uint64_t kFatbinCompressed = 0x2000;
constexpr uint16_t kEntryPtx = 1, kEntryElf = 2;

template <typename T>
bool rd(const uint8_t* d, size_t size, size_t off, T& v) {
  if (off > size || size - off < sizeof(T)) return false;
  std::memcpy(&v, d + off, sizeof(T));
  return true;
}

struct Section {
  std::string name;
  uint32_t type = 0;
  uint64_t offset = 0, size = 0;
  uint32_t link = 0;
  uint64_t entsize = 0;
};

// The section table of an ELF64 little-endian file (names resolved).
Result<std::vector<Section>> elf_sections(const uint8_t* d, size_t size, const std::string& origin) {
  if (size < 64 || std::memcmp(d, "\x7f" "ELF", 4) != 0 || d[4] != 2 || d[5] != 1)
    return make_error(StatusCode::kDataLoss, "{}: not a 64-bit little-endian ELF file", origin);
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0, shstrndx = 0;
  rd(d, size, 0x28, shoff);
  rd(d, size, 0x3a, shentsize);
  rd(d, size, 0x3c, shnum);
  rd(d, size, 0x3e, shstrndx);
  if (shentsize < 64 || shoff > size || (size - shoff) / shentsize < shnum || shstrndx >= shnum)
    return make_error(StatusCode::kDataLoss, "{}: bad ELF section table", origin);
  std::vector<Section> secs(shnum);
  std::vector<uint32_t> name_off(shnum);
  for (uint16_t i = 0; i < shnum; ++i) {
    const size_t o = shoff + static_cast<size_t>(i) * shentsize;
    rd(d, size, o, name_off[i]);
    rd(d, size, o + 4, secs[i].type);
    rd(d, size, o + 24, secs[i].offset);
    rd(d, size, o + 32, secs[i].size);
    rd(d, size, o + 40, secs[i].link);
    rd(d, size, o + 56, secs[i].entsize);
    // NOBITS (8) sections occupy no file bytes; every other one must lie inside the file.
    if (secs[i].type != 8 && (secs[i].offset > size || size - secs[i].offset < secs[i].size))
      return make_error(StatusCode::kDataLoss, "{}: ELF section {} outside the file", origin, i);
  }
  const Section& strtab = secs[shstrndx];
  for (uint16_t i = 0; i < shnum; ++i) {
    if (name_off[i] >= strtab.size) return make_error(StatusCode::kDataLoss, "{}: bad section name", origin);
    const char* s = reinterpret_cast<const char*>(d + strtab.offset + name_off[i]);
    secs[i].name.assign(s, strnlen(s, strtab.size - name_off[i]));
  }
  return secs;
}

Status scan_fatbin(const uint8_t* d, size_t size, const std::string& origin, FatbinScan& out) {
  size_t pos = 0;
  while (pos + 16 <= size) {
    uint32_t magic = 0;
    uint16_t hsz = 0;
    uint64_t fsz = 0;
    rd(d, size, pos, magic);
    if (magic != kFatbinMagic) {  // containers are 8-byte aligned; skip padding
      pos += 8;
      continue;
    }
    rd(d, size, pos + 6, hsz);
    rd(d, size, pos + 8, fsz);
    if (hsz < 16 || pos + hsz > size || size - pos - hsz < fsz)
      return make_error(StatusCode::kDataLoss, "{}: fatbin container at {} overruns its section", origin, pos);
    size_t off = pos + hsz;
    const size_t end = off + fsz;
    while (off < end) {
      uint16_t kind = 0;
      uint32_t ehs = 0, sm = 0;
      uint64_t payload = 0, flags = 0;
      if (!rd(d, end, off, kind) || !rd(d, end, off + 4, ehs) || !rd(d, end, off + 8, payload) ||
          !rd(d, end, off + 28, sm) || !rd(d, end, off + 40, flags) || ehs < 48 || ehs > end - off ||
          payload > end - off - ehs)
        return make_error(StatusCode::kDataLoss, "{}: bad fatbin entry at {}", origin, off);
      if (kind == kEntryPtx) {
        ++out.ptx_entries;
      } else if (kind == kEntryElf) {
        const std::string where = fmt::format("{} (sm_{} cubin)", origin, sm);
        if (flags & kFatbinCompressed)
          return make_error(StatusCode::kUnimplemented,
                            "{}: the fatbin entry is compressed; this check reads uncompressed cubins (build with "
                            "nvcc --compress-mode=none)",
                            where);
        auto c = parse_cubin(d + off + ehs, static_cast<size_t>(payload), where);
        if (!c.ok()) return c.status();
        c->fatbin_sm = static_cast<int>(sm);
        out.cubins.push_back(std::move(*c));
      }
      off += ehs + payload;
    }
    pos = end;
  }
  return Status();
}

Status scan_elf(const uint8_t* d, size_t size, const std::string& origin, FatbinScan& out) {
  ++out.host_elfs;
  TANDEM_ASSIGN_OR_RETURN(auto secs, elf_sections(d, size, origin));
  for (const Section& s : secs) {
    if (s.name != ".nv_fatbin") continue;
    ++out.with_fatbin;
    TANDEM_RETURN_IF_ERROR(scan_fatbin(d + s.offset, s.size, origin, out));
  }
  return Status();
}

}  // namespace

Result<Cubin> parse_cubin(const uint8_t* d, size_t size, std::string origin) {
  Cubin c;
  c.origin = std::move(origin);
  TANDEM_ASSIGN_OR_RETURN(auto secs, elf_sections(d, size, c.origin));
  uint32_t eflags = 0;
  rd(d, size, 0x30, eflags);
  c.elf_sm = static_cast<int>((eflags >> 8) & 0xff);
  std::map<std::string, const Section*> by_name;
  const Section* symtab = nullptr;
  for (const Section& s : secs) {
    by_name[s.name] = &s;
    if (s.type == 2) symtab = &s;  // SHT_SYMTAB
    if (s.name == ".note.nv.tkinfo") {
      const std::string note(reinterpret_cast<const char*>(d + s.offset), s.size);
      const size_t at = note.find("-arch ");
      if (at != std::string::npos) {
        const size_t b = at + 6;
        size_t e = b;
        while (e < note.size() && note[e] != ' ' && note[e] != '\0') ++e;
        c.ptxas_arch = note.substr(b, e - b);
      }
    }
  }
  if (!symtab || symtab->link >= secs.size() || symtab->entsize < 24)
    return make_error(StatusCode::kDataLoss, "{}: cubin without a symbol table", c.origin);
  const Section& strs = secs[symtab->link];
  const size_t nsym = symtab->size / symtab->entsize;
  auto sym_name = [&](uint32_t off) -> std::string {
    if (off >= strs.size) return {};
    const char* p = reinterpret_cast<const char*>(d + strs.offset + off);
    return std::string(p, strnlen(p, strs.size - off));
  };
  std::vector<std::string> kernels;
  for (size_t i = 0; i < nsym; ++i) {
    const size_t o = symtab->offset + i * symtab->entsize;
    uint32_t name = 0;
    uint8_t info = 0, other = 0;
    uint64_t value = 0;
    rd(d, size, o, name);
    rd(d, size, o + 4, info);
    rd(d, size, o + 5, other);
    rd(d, size, o + 8, value);
    const std::string n = sym_name(name);
    if (n == ".nv.reservedSmem.cap") c.reserved_smem = static_cast<int64_t>(value);
    if ((info & 0xf) == 2 && (other & 0x10)) kernels.push_back(n);  // STT_FUNC, CUDA entry
  }
  for (const std::string& k : kernels) {
    Kernel kk;
    kk.name = k;
    auto sh = by_name.find(".nv.shared." + k);
    if (sh != by_name.end()) kk.shared_section = static_cast<int64_t>(sh->second->size);
    kk.static_smem = kk.shared_section >= c.reserved_smem ? kk.shared_section - c.reserved_smem : kk.shared_section;
    auto tx = by_name.find(".text." + k);
    if (tx != by_name.end()) kk.code_bytes = static_cast<int64_t>(tx->second->size);
    c.kernels.push_back(std::move(kk));
  }
  return c;
}

Status scan_file(const std::string& path, FatbinScan& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(StatusCode::kNotFound, "cannot read {}", path);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const uint8_t* d = bytes.data();
  const size_t size = bytes.size();
  if (size >= 8 && std::memcmp(d, "!<arch>\n", 8) == 0) {
    // ar: 60-byte member headers; GNU long names live in the "//" member as "name/\n".
    std::string long_names;
    size_t pos = 8;
    while (pos + 60 <= size) {
      const std::string hdr(reinterpret_cast<const char*>(d + pos), 60);
      const uint64_t msize = std::strtoull(hdr.substr(48, 10).c_str(), nullptr, 10);
      const size_t body = pos + 60;
      if (msize > size - body) return make_error(StatusCode::kDataLoss, "{}: archive member overruns the file", path);
      std::string name = hdr.substr(0, 16);
      name = name.substr(0, name.find_last_not_of(' ') + 1);
      if (name == "//") {
        long_names.assign(reinterpret_cast<const char*>(d + body), msize);
      } else if (name != "/" && name != "/SYM64/") {
        if (name.size() > 1 && name[0] == '/') {
          const size_t at = std::strtoull(name.c_str() + 1, nullptr, 10);
          name = at < long_names.size() ? long_names.substr(at, long_names.find('/', at) - at) : name;
        } else if (!name.empty() && name.back() == '/') {
          name.pop_back();
        }
        if (msize >= 4 && std::memcmp(d + body, "\x7f" "ELF", 4) == 0)
          TANDEM_RETURN_IF_ERROR(scan_elf(d + body, msize, path + "[" + name + "]", out));
      }
      pos = body + msize + (msize & 1);
    }
    return Status();
  }
  return scan_elf(d, size, path, out);
}

std::string function_name(const std::string& m) {
  if (m.rfind("_Z", 0) != 0) return m;
  size_t p = 2;
  const bool nested = p < m.size() && m[p] == 'N';
  if (nested) {
    ++p;
    while (p < m.size() && (m[p] == 'r' || m[p] == 'V' || m[p] == 'K')) ++p;
  }
  std::string last;
  // <source-name> = <length><characters>, one per scope, the function's own last; template
  // arguments ('I') or the end of the nested name ('E') follow it.
  while (p < m.size() && std::isdigit(static_cast<unsigned char>(m[p]))) {
    size_t len = 0;
    while (p < m.size() && std::isdigit(static_cast<unsigned char>(m[p]))) len = len * 10 + (m[p++] - '0');
    if (len > m.size() - p) return m;
    last = m.substr(p, len);
    p += len;
    if (!nested) break;
  }
  return last.empty() ? m : last;
}

bool mangled_names(const std::string& mangled, const std::string& name) { return function_name(mangled) == name; }

int64_t max_smem_per_block(int sm) {
  switch (sm) {
    case 80: case 87: return 163 * 1024;
    case 86: case 89: return 99 * 1024;
    case 90: case 100: case 101: case 103: case 110: return 227 * 1024;
    case 120: case 121: return 99 * 1024;
    default: return -1;
  }
}

}  // namespace tandem::cubin

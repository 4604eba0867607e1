// Reads the device code a build produced without CUDA's binary tools (cuobjdump is not on the build
// machine): the fatbins in host ELF files' `.nv_fatbin` sections (executables, objects, and `ar`
// archives of objects), and in each ELF cubin the kernels with their static shared memory (the size
// of `.nv.shared.<kernel>`), code size (`.text.<kernel>`), and the target ptxas compiled for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem::cubin {

struct Kernel {
  std::string name;             // mangled symbol
  int64_t shared_section = 0;   // size of .nv.shared.<name> (0: no section)
  int64_t static_smem = 0;      // shared_section less the reserved area it includes (Cubin::reserved_smem)
  int64_t code_bytes = 0;       // size of .text.<name>
};

struct Cubin {
  std::string origin;           // "<file>[member]"
  int fatbin_sm = 0;            // the SM its fatbin entry is for (120 = sm_120)
  int elf_sm = 0;               // the SM in the cubin's ELF header flags
  std::string ptxas_arch;       // ptxas' "-arch" as recorded in .note.nv.tkinfo ("sm_120", "sm_90a")
  int64_t reserved_smem = 0;    // .nv.reservedSmem.cap: system shared memory each kernel's section includes
  std::vector<Kernel> kernels;
};

struct FatbinScan {
  std::vector<Cubin> cubins;
  int ptx_entries = 0;          // PTX kept in the fatbins (not read)
  int host_elfs = 0;            // ELF files or archive members looked at
  int with_fatbin = 0;          // ... of which had a .nv_fatbin section
};

// Every cubin in `path` (an ELF file or an `ar` archive of ELF objects). A malformed file, or a
// compressed fatbin entry (this reader does not decompress), is an error naming the file.
Status scan_file(const std::string& path, FatbinScan& out);

// One ELF cubin.
Result<Cubin> parse_cubin(const uint8_t* data, size_t size, std::string origin);

// The unqualified function name in an Itanium-mangled symbol ("_ZN6tandem12_GLOBAL__N_16kernelEv"
// -> "kernel"; template arguments dropped); the symbol itself when it is not mangled that way.
std::string function_name(const std::string& mangled);
// Whether `mangled` names a function whose unqualified name is `name`.
bool mangled_names(const std::string& mangled, const std::string& name);

// Per-block shared memory a target allows (static + dynamic, the opt-in maximum; CUDA C++
// Programming Guide, technical specifications per compute capability), or -1 for an unknown SM.
int64_t max_smem_per_block(int sm);

}  // namespace tandem::cubin

# Cross-compiles the CPU build for aarch64 (the GB10 hosts' CPU) with Debian's cross toolchain
# (g++-aarch64-linux-gnu) against the arm64 multiarch packages in /usr/lib/aarch64-linux-gnu;
# ctest runs the test binaries under qemu-user (tools/aarch64/run.sh).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# add_test() commands of target executables run through the emulator.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
# pkg-config must see only the arm64 .pc files (and the architecture-independent ones).
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

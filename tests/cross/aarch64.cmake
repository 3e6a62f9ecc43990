# Cross build for aarch64 (Debian's g++-aarch64-linux-gnu, arm64 -dev packages via multiarch),
# tests run under qemu-user: ctest prefixes every test command with CMAKE_CROSSCOMPILING_EMULATOR.
#   cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=tests/cross/aarch64.cmake -DKVSNAP_CORE_ONLY=ON
# tests/cross/run.sh does all of it.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Libraries and headers: the arm64 multiarch ones (/usr/lib/aarch64-linux-gnu) and the
# architecture-independent headers in /usr/include (nlohmann-json, gtest).
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# The loader and libc of the cross toolchain (libc6-arm64-cross) must not meet the multiarch
# libc6:arm64 the -dev packages pull in (/lib/aarch64-linux-gnu, found through ld.so.cache): a
# mixed pair hangs at the first thread under qemu. LD_LIBRARY_PATH puts the toolchain's first.
set(KVSNAP_QEMU_AARCH64 qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib)
set(CMAKE_CROSSCOMPILING_EMULATOR ${KVSNAP_QEMU_AARCH64})

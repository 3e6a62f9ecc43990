# The aarch64 cross build with clang 16 instead of gcc: the closest this Linux machine gets to Apple
# clang on Apple Silicon (same front end and arm_neon.h; libstdc++ and glibc of the gcc cross
# toolchain, which clang finds in /usr/lib/gcc-cross). Everything else as tests/cross/aarch64.cmake.
#   bash tests/cross/run.sh build-aarch64-clang tests/cross/aarch64-clang.cmake
include(${CMAKE_CURRENT_LIST_DIR}/aarch64.cmake)
set(CMAKE_C_COMPILER clang-16)
set(CMAKE_CXX_COMPILER clang++-16)
set(CMAKE_C_COMPILER_TARGET aarch64-linux-gnu)
set(CMAKE_CXX_COMPILER_TARGET aarch64-linux-gnu)

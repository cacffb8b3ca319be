# Cross-compiling for 64-bit Arm Linux with Debian's cross compiler
# (apt-get install g++-aarch64-linux-gnu qemu-user). Used by cross/ (the
# kernel-only build that scripts/test_arm.sh runs under qemu-aarch64).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Headers and libraries from the Arm sysroot only; programs from the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# try_run and ctest run Arm binaries through user-mode emulation; "max" has
# the dot-product and half-precision extensions the NEON target needs.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -cpu max)

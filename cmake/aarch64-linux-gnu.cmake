# Cross-compiling to 64-bit Arm Linux with Debian's g++-aarch64-linux-gnu (scripts/test-arm.sh).
# Target libraries come from Debian's arm64 cross sysroot (/usr/aarch64-linux-gnu, from
# libc6-dev-arm64-cross); arm64 Highway is passed in as hwy_DIR, GoogleTest is compiled from
# /usr/src/googletest (see cmake/kernel_tests.cmake).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(GEMMA4RT_CROSS_TRIPLE aarch64-linux-gnu)

# g++-aarch64-linux-gnu installs aarch64-linux-gnu-g++; fall back to the versioned name.
find_program(GEMMA4RT_CROSS_CXX NAMES ${GEMMA4RT_CROSS_TRIPLE}-g++ ${GEMMA4RT_CROSS_TRIPLE}-g++-12 REQUIRED)
set(CMAKE_CXX_COMPILER ${GEMMA4RT_CROSS_CXX})

set(CMAKE_FIND_ROOT_PATH /usr/${GEMMA4RT_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Runs target binaries (try_run, gtest discovery) under qemu-user with the cross sysroot.
find_program(GEMMA4RT_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(GEMMA4RT_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${GEMMA4RT_QEMU_AARCH64} -L /usr/${GEMMA4RT_CROSS_TRIPLE})
endif()

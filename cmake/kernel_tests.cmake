# GEMMA4RT_KERNEL_TESTS_ONLY=ON: only the CPU kernels and their tests, as one executable
# gemma4rt_kernel_tests, with no dependency beyond Highway, GoogleTest and nlohmann/json's header
# (no CLI11, no cpp-httplib). For cross builds run under qemu-user (scripts/test-arm.sh with
# cmake/aarch64-linux-gnu.cmake). New kernel files join by name: src/backends/cpu/kernels*.cc,
# src/backends/cpu/attention*.cc and tests/*kernels*_test.cc.
find_package(Threads REQUIRED)
find_package(hwy 1.0 REQUIRED)

# GoogleTest: the installed one on a native build; compiled from the sources Debian's googletest
# package ships (/usr/src/googletest, pulled in by libgtest-dev) when cross-compiling.
set(GEMMA4RT_GTEST_SOURCE_DIR /usr/src/googletest/googletest CACHE PATH "GoogleTest sources")
if(NOT CMAKE_CROSSCOMPILING)
  find_package(GTest QUIET)
endif()
if(TARGET GTest::gtest AND TARGET GTest::gtest_main)
  set(GEMMA4RT_GTEST_LIBS GTest::gtest GTest::gtest_main)
else()
  if(NOT EXISTS ${GEMMA4RT_GTEST_SOURCE_DIR}/src/gtest-all.cc)
    message(FATAL_ERROR "GoogleTest sources not found in ${GEMMA4RT_GTEST_SOURCE_DIR} (Debian: googletest)")
  endif()
  add_library(gemma4rt_gtest STATIC ${GEMMA4RT_GTEST_SOURCE_DIR}/src/gtest-all.cc
                                    ${GEMMA4RT_GTEST_SOURCE_DIR}/src/gtest_main.cc)
  target_include_directories(gemma4rt_gtest SYSTEM PUBLIC ${GEMMA4RT_GTEST_SOURCE_DIR}/include
                             PRIVATE ${GEMMA4RT_GTEST_SOURCE_DIR})
  target_link_libraries(gemma4rt_gtest PUBLIC Threads::Threads)
  set(GEMMA4RT_GTEST_LIBS gemma4rt_gtest)
endif()

# nlohmann/json is header-only and the same on every architecture: the host's header will do.
find_path(GEMMA4RT_NLOHMANN_INCLUDE nlohmann/json.hpp PATHS /usr/include NO_CMAKE_FIND_ROOT_PATH)
if(NOT GEMMA4RT_NLOHMANN_INCLUDE)
  message(FATAL_ERROR "nlohmann/json.hpp not found (Debian: nlohmann-json3-dev)")
endif()

file(GLOB GEMMA4RT_KERNEL_SOURCES CONFIGURE_DEPENDS
     ${CMAKE_SOURCE_DIR}/src/base/*.cc ${CMAKE_SOURCE_DIR}/src/tensor/*.cc
     ${CMAKE_SOURCE_DIR}/src/backends/cpu/kernels*.cc ${CMAKE_SOURCE_DIR}/src/backends/cpu/attention*.cc)
file(GLOB GEMMA4RT_KERNEL_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/*kernels*_test.cc)

enable_testing()
add_executable(gemma4rt_kernel_tests ${GEMMA4RT_KERNEL_SOURCES} ${GEMMA4RT_KERNEL_TEST_SOURCES})
target_include_directories(gemma4rt_kernel_tests PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_include_directories(gemma4rt_kernel_tests SYSTEM PRIVATE ${GEMMA4RT_NLOHMANN_INCLUDE})
target_link_libraries(gemma4rt_kernel_tests PRIVATE hwy::hwy ${GEMMA4RT_GTEST_LIBS} Threads::Threads)
target_compile_definitions(gemma4rt_kernel_tests PRIVATE GEMMA4RT_TEST_DATA_DIR="${CMAKE_SOURCE_DIR}/tests")
# As in the full build: no fused multiply-add unless written as one (the SIMD kernels rebuild
# weights bit-identically to src/tensor/dequant.cc). Whole target, so new kernel files get it too.
# GCC 12 contracts by default even under -std=c++20 (aarch64 fused Rope's multiply-adds).
target_compile_options(gemma4rt_kernel_tests PRIVATE -ffp-contract=off)
add_test(NAME gemma4rt_kernel_tests COMMAND gemma4rt_kernel_tests)

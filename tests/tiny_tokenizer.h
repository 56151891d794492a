// The tiny Gemma 4 tokenizer (tests/data/tokenizer_gemma4_tiny), loaded once per test binary.
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "tokenizer/tokenizer.h"

namespace g4::test_util {

inline const Tokenizer& TinyGemma4Tokenizer() {
  static std::unique_ptr<Tokenizer> t = [] {
    auto r = Tokenizer::FromHfDirectory(std::string(GEMMA4RT_TEST_DATA_DIR) + "/data/tokenizer_gemma4_tiny");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(r).value();
  }();
  return *t;
}

}  // namespace g4::test_util

// UTF-8 hygiene of text the coordinator keeps in proto strings.
#include "services/common/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace stagewise {
namespace {

TEST(Utf8, WellFormedTextIsValidAndKept) {
  for (const std::string& text : {std::string(""), std::string("plain"), std::string("é ü"),
                                  std::string("\xe2\x82\xac"), std::string("\xf0\x9f\x98\x80")}) {
    EXPECT_TRUE(IsValidUtf8(text)) << text;
    EXPECT_EQ(ToValidUtf8(text), text);
  }
}

TEST(Utf8, BrokenSequencesAreReplacedByteByByte) {
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_EQ(ToValidUtf8("a\xff"
                        "b"),
            "a?b");
  EXPECT_EQ(ToValidUtf8("\xc3"), "?");                 // cut short
  EXPECT_EQ(ToValidUtf8("\xc0\xaf"), "??");            // overlong '/'
  EXPECT_EQ(ToValidUtf8("\xed\xa0\x80"), "???");       // a surrogate
  EXPECT_EQ(ToValidUtf8("\xf4\x90\x80\x80"), "????");  // above U+10FFFF
  EXPECT_EQ(ToValidUtf8(std::string("\x00\xea\x00", 3)), std::string("\x00?\x00", 3));
  for (const std::string& bad :
       {std::string("\xff\xfe"), std::string("\xe2\x82"), std::string("x\xc3\x28")}) {
    EXPECT_TRUE(IsValidUtf8(ToValidUtf8(bad)));
  }
}

TEST(Utf8, PrefixesEndOnACharacterBoundary) {
  const std::string text =
      "ab\xc3\xa9"
      "cd";  // a b é c d
  EXPECT_EQ(Utf8Prefix(text, 3), "ab");
  EXPECT_EQ(Utf8Prefix(text, 4), "ab\xc3\xa9");
  EXPECT_EQ(Utf8Prefix(text, 100), text);
  const std::string euros = "\xe2\x82\xac\xe2\x82\xac";
  for (size_t n = 0; n <= euros.size(); ++n) {
    EXPECT_TRUE(IsValidUtf8(Utf8Prefix(euros, n))) << n;
    EXPECT_EQ(Utf8Prefix(euros, n).size() % 3, 0u) << n;
  }
}

}  // namespace
}  // namespace stagewise

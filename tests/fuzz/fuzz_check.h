// FUZZ_CHECK(cond, what): a fuzz target's invariant. On failure it prints
// what broke and aborts, which libFuzzer (and the replay driver, through the
// test's exit status) reports as a crash with the input that caused it.
#ifndef STAGEWISE_TESTS_FUZZ_FUZZ_CHECK_H_
#define STAGEWISE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <google/protobuf/stubs/logging.h>

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, what)                                                                     \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "%s:%d: invariant broken: %s (%s)\n", __FILE__, __LINE__, #cond, what); \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)

// Protobuf logs every string field that is not UTF-8 as it refuses it: a fuzz
// target parses millions of those. Call once (a function-local static).
inline bool QuietProtobufLogs() {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return true;
}

#endif  // STAGEWISE_TESTS_FUZZ_FUZZ_CHECK_H_

// RequestThreadSlice (services/common/thread_slice.h): the calling thread
// gets the slice it asks for where the kernel takes one, keeps its nice
// value, and out-of-range requests change nothing.
#include "services/common/thread_slice.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

namespace stagewise {
namespace {

int NiceOfThisThread() {
  errno = 0;
  return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
}

TEST(ThreadSlice, AThreadGetsTheSliceItAsksForAndKeepsItsNiceValue) {
  // On a thread of its own: the test's thread keeps its scheduling.
  std::thread t([] {
    const int nice = NiceOfThisThread();
    // One step nicer (always allowed), so that keeping it is seen.
    ASSERT_EQ(setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice + 1), 0);
    const bool taken = RequestThreadSlice(250);
    EXPECT_EQ(NiceOfThisThread(), nice + 1);
    // Kernels before 6.12 take the call and report no slice.
    if (taken && ThreadSliceMicros() != 0) {
      EXPECT_EQ(ThreadSliceMicros(), 250);
      EXPECT_TRUE(RequestThreadSlice());
      EXPECT_EQ(ThreadSliceMicros(), kShortSliceMicros);
    }
    // Out of the kernel's range: refused here, nothing changed.
    const int64_t before = ThreadSliceMicros();
    EXPECT_FALSE(RequestThreadSlice(50));
    EXPECT_FALSE(RequestThreadSlice(200000));
    EXPECT_EQ(ThreadSliceMicros(), before);
  });
  t.join();
}

}  // namespace
}  // namespace stagewise

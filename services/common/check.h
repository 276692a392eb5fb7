// Assertions, in the spirit of Envoy's ASSERT / ENVOY_BUG and Ray's
// RAY_CHECK(thread_checker_.IsOnSameThread()):
//
//   STAGEWISE_DCHECK(cond) << "context";  debug builds: abort with the message
//                                         when cond is false; release builds:
//                                         compiled out (cond not evaluated).
//   STAGEWISE_BUG(cond) << "context";     cond must hold. When it does not,
//                                         every build logs "BUG: ..." at ERROR
//                                         and counts it (BugCount(); the
//                                         processes export it as
//                                         stagewise_process_bugs_total); debug
//                                         builds abort too. For states that
//                                         are wrong but survivable.
//   ThreadChecker                         "this thread only" made checkable:
//                                         Bind() on the owning thread, then
//                                         STAGEWISE_BUG(checker.OnOwner()) at
//                                         the top of each method that needs it.
#ifndef STAGEWISE_SERVICES_COMMON_CHECK_H_
#define STAGEWISE_SERVICES_COMMON_CHECK_H_

#include <atomic>
#include <cstdint>
#include <sstream>
#include <thread>

namespace stagewise {

// How many STAGEWISE_BUG conditions failed in this process.
int64_t BugCount();

namespace check_internal {

// Reports a failed condition when the statement ends.
class Failure {
 public:
  Failure(const char* kind, const char* condition, const char* file, int line, bool fatal);
  ~Failure();
  Failure(const Failure&) = delete;
  Failure& operator=(const Failure&) = delete;
  std::ostream& stream() { return out_; }

 private:
  std::ostringstream out_;
  const char* kind_;
  const char* condition_;
  const char* file_;
  int line_;
  bool fatal_;
};

struct Voidify {
  void operator&(std::ostream&) {}
};

// The stream of a check that is compiled out.
class NullStream {
 public:
  std::ostream& stream() { return out_; }

 private:
  std::ostringstream out_;
};

#ifdef NDEBUG
inline constexpr bool kDebug = false;
#else
inline constexpr bool kDebug = true;
#endif

}  // namespace check_internal

class ThreadChecker {
 public:
  // The calling thread owns what this checker guards from now on.
  void Bind() { owner_.store(std::this_thread::get_id(), std::memory_order_relaxed); }
  // True on the owner (or before any Bind).
  bool OnOwner() const {
    const std::thread::id owner = owner_.load(std::memory_order_relaxed);
    return owner == std::thread::id() || owner == std::this_thread::get_id();
  }

 private:
  std::atomic<std::thread::id> owner_{};
};

}  // namespace stagewise

#define STAGEWISE_BUG(condition)                                                                \
  (condition) ? (void)0                                                                         \
              : ::stagewise::check_internal::Voidify() &                                        \
                    ::stagewise::check_internal::Failure("BUG", #condition, __FILE__, __LINE__, \
                                                         ::stagewise::check_internal::kDebug)   \
                        .stream()

#ifdef NDEBUG
// Compiled (so its names count as used) but never evaluated.
#define STAGEWISE_DCHECK(condition)                                \
  (true || (condition)) ? (void)0                                  \
                        : ::stagewise::check_internal::Voidify() & \
                              ::stagewise::check_internal::NullStream().stream()
#else
#define STAGEWISE_DCHECK(condition)                                                                \
  (condition) ? (void)0                                                                            \
              : ::stagewise::check_internal::Voidify() &                                           \
                    ::stagewise::check_internal::Failure("DCHECK", #condition, __FILE__, __LINE__, \
                                                         /*fatal=*/true)                           \
                        .stream()
#endif

#endif  // STAGEWISE_SERVICES_COMMON_CHECK_H_

#include "services/common/check.h"

#include <cstdlib>

#include "services/common/log.h"

namespace stagewise {
namespace {

std::atomic<int64_t> bugs{0};

}  // namespace

int64_t BugCount() { return bugs.load(std::memory_order_relaxed); }

namespace check_internal {

Failure::Failure(const char* kind, const char* condition, const char* file, int line, bool fatal)
    : kind_(kind), condition_(condition), file_(file), line_(line), fatal_(fatal) {}

Failure::~Failure() {
  bugs.fetch_add(1, std::memory_order_relaxed);
  {
    log::Line line(log::Level::kError, file_, line_);
    line.stream() << kind_ << ": " << condition_ << " failed";
    const std::string context = out_.str();
    if (!context.empty()) line.stream() << ": " << context;
  }
  if (fatal_) std::abort();
}

}  // namespace check_internal
}  // namespace stagewise

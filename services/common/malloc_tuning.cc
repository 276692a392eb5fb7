// glibc malloc settings for tensor workloads, applied before main() in every
// stagewise binary, test and benchmark (linked as an object library, so the
// initializer cannot be dropped by the linker).
//
// With glibc's defaults every tensor above the dynamic mmap threshold is
// mmap'ed and munmap'ed each step (tens of thousands of minor page faults per
// step), and each compute thread gets its own arena whose freed pages go back
// to the kernel. Measured on the quickstart model (docs/architecture.md,
// "Memory allocator"), the three settings below together make training
// several times faster; either threshold alone is not enough.
//
// STAGEWISE_MALLOC_TUNING=0 keeps glibc's defaults (for comparisons). An
// explicit MALLOC_*_ environment variable still wins over these values.
#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace {

bool EnvSet(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

struct MallocTuning {
  MallocTuning() {
    const char* off = std::getenv("STAGEWISE_MALLOC_TUNING");
    if (off != nullptr && std::strcmp(off, "0") == 0) return;
    // Blocks up to 32 MiB come from the heap and are reused step after step.
    if (!EnvSet("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 32 << 20);
    // Keep up to 1 GiB of freed heap instead of trimming it every step.
    if (!EnvSet("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 1 << 30);
    // Grow (and keep) the heap 64 MiB beyond what is asked: a stage's batch or
    // activations of tens of MiB are then carved from pages already mapped,
    // not faulted in anew each step (docs/performance.md, "Neighbours on one
    // host", measured with the emulated benchmark).
    if (!EnvSet("MALLOC_TOP_PAD_")) mallopt(M_TOP_PAD, 64 << 20);
    // One arena: gRPC and compute threads hand tensors to each other, and
    // per-thread arenas return (and re-fault) their pages independently.
    if (!EnvSet("MALLOC_ARENA_MAX")) mallopt(M_ARENA_MAX, 1);
  }
};

const MallocTuning kMallocTuning;

}  // namespace

#include "services/tensor/shared_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "services/tensor/host_pinning.h"

namespace stagewise {
namespace {

constexpr uint64_t kHeaderBytes = 4096;  // the file's first page
constexpr char kFileMagic[8] = {'S', 'W', 'R', 'I', 'N', 'G', '0', '1'};
constexpr uint64_t kRegionMagic = 0x5357524547494f4eULL;  // "SWREGION"

// At the start of the file.
struct FileHeader {
  char magic[8];
  uint64_t size;  // payload area
  char token[16];
};

// Before every region's payload, kAlign bytes.
// kHeld: the reader reads the payload in place (SharedRingView::Hold); the
// writer reclaims only kFree regions (and placed ones never published).
// kPlaced: a tensor is being made there (SharedRing::Place); not the
// reader's until Publish makes it kBusy.
enum RegionState : uint32_t { kBusy = 1, kFree = 2, kHeld = 3, kPlaced = 4 };
struct RegionHeader {
  uint64_t magic;   // kRegionMagic ^ offset
  uint64_t length;  // payload bytes
  std::atomic<uint32_t> state;
};
static_assert(sizeof(RegionHeader) <= SharedRing::kAlign);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

std::atomic<int64_t> total_payloads{0};
std::atomic<int64_t> total_full{0};
std::atomic<int64_t> total_in_place{0};

uint64_t RegionBytes(uint64_t length) {
  return SharedRing::kAlign +
         (length + SharedRing::kAlign - 1) / SharedRing::kAlign * SharedRing::kAlign;
}

RegionHeader* At(uint8_t* area, uint64_t offset) {
  return reinterpret_cast<RegionHeader*>(area + offset);
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-')) {
      return false;
    }
  }
  return true;
}

std::string Errno(const std::string& what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedRing>> SharedRing::Create(const std::string& dir,
                                                               uint64_t bytes) {
  if (bytes < kAlign * 4 || bytes > (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared ring size ", bytes, " bytes is out of range"));
  }
  std::unique_ptr<SharedRing> ring(new SharedRing());
  char random[24];
  if (getrandom(random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
    return absl::InternalError(Errno("getrandom"));
  }
  ring->token_.assign(random, 16);
  ring->name_ =
      absl::StrCat("stagewise-ring-", absl::BytesToHexString(std::string(random + 16, 8)));
  ring->path_ = absl::StrCat(dir, "/", ring->name_);
  ring->size_ = (bytes + kHeaderBytes - 1) / kHeaderBytes * kHeaderBytes;
  ring->mapped_ = kHeaderBytes + ring->size_;
  const int fd = open(ring->path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(Errno(absl::StrCat("creating the shared ring in ", dir)));
  }
  void* base = MAP_FAILED;
  // Reserved now (posix_fallocate, not a sparse ftruncate): a tmpfs too small
  // for the ring (a container's 64 MiB /dev/shm) fails here, not with SIGBUS
  // at the first write past its end.
  errno = posix_fallocate(fd, 0, static_cast<off_t>(ring->mapped_));
  if (errno == 0) {
    base = mmap(nullptr, ring->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int saved = errno;
  close(fd);
  if (base == MAP_FAILED) {
    unlink(ring->path_.c_str());
    errno = saved;
    return absl::FailedPreconditionError(Errno(absl::StrCat("sizing the shared ring in ", dir)));
  }
  ring->base_ = static_cast<uint8_t*>(base);
  ring->area_ = ring->base_ + kHeaderBytes;
  auto* header = reinterpret_cast<FileHeader*>(ring->base_);
  std::memcpy(header->magic, kFileMagic, sizeof(kFileMagic));
  header->size = ring->size_;
  std::memcpy(header->token, ring->token_.data(), 16);
  ring->pinned_ = PinHostRange(ring->base_, ring->mapped_);  // for a GPU stage's copies
  absl::MutexLock lock(&ring->mu_);
  ring->free_[0] = ring->size_;
  return ring;
}

SharedRing::~SharedRing() {
  bool registered = false;
  {
    absl::MutexLock lock(&mu_);
    registered = registered_;
  }
  if (registered) UnregisterHostArena(this);
  if (pinned_) UnpinHostRange(base_);
  if (base_ != nullptr) munmap(base_, mapped_);
  if (!path_.empty()) unlink(path_.c_str());
}

void SharedRing::FreeLocked(uint64_t offset, uint64_t bytes) {
  used_ -= bytes;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  free_.emplace(offset, bytes);
}

void SharedRing::ReclaimLocked() {
  for (auto it = regions_.begin(); it != regions_.end();) {
    const Outstanding& r = it->second;
    const bool done =
        !r.writer_held &&
        (!r.published || At(area_, it->first)->state.load(std::memory_order_acquire) == kFree);
    if (!done) {
      ++it;
      continue;
    }
    FreeLocked(it->first, r.bytes);
    it = regions_.erase(it);
  }
}

std::optional<SharedRing::Region> SharedRing::AllocateLocked(uint64_t length, bool placed) {
  const uint64_t need = RegionBytes(length);
  if (need > size_) return std::nullopt;
  ReclaimLocked();
  auto it = free_.begin();
  while (it != free_.end() && it->second < need) ++it;
  if (it == free_.end()) return std::nullopt;
  const uint64_t at = it->first;
  if (it->second > need) free_.emplace(at + need, it->second - need);
  free_.erase(it);
  RegionHeader* h = At(area_, at);
  h->magic = kRegionMagic ^ at;
  h->length = length;
  h->state.store(placed ? kPlaced : kBusy, std::memory_order_release);
  regions_[at] = Outstanding{need, length, placed, placed, !placed};
  used_ += need;
  return Region{at, area_ + at + kAlign, length};
}

std::optional<SharedRing::Region> SharedRing::Allocate(uint64_t length) {
  absl::MutexLock lock(&mu_);
  std::optional<Region> region = AllocateLocked(length, false);
  if (!region) {
    total_full.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  total_payloads.fetch_add(1, std::memory_order_relaxed);
  return region;
}

void* SharedRing::Place(size_t bytes) { return PlaceWithin(bytes, size_ / 2); }

void* SharedRing::PlaceForSend(size_t bytes) { return PlaceWithin(bytes, size_); }

void* SharedRing::PlaceWithin(size_t bytes, uint64_t limit) {
  std::shared_ptr<SharedRing> self = weak_from_this().lock();
  if (self == nullptr) return nullptr;  // not owned by a shared_ptr: cannot keep itself alive
  absl::MutexLock lock(&mu_);
  ReclaimLocked();
  if (used_ + RegionBytes(bytes) > limit) return nullptr;
  if (!registered_) {
    if (!RegisterHostArena(this, area_, size_)) return nullptr;
    registered_ = true;
  }
  std::optional<Region> region = AllocateLocked(bytes, true);
  if (!region) return nullptr;
  placed_bytes_ += regions_[region->offset].bytes;
  if (keep_ == nullptr) keep_ = std::move(self);
  return region->data;
}

void SharedRing::Unplace(void* data) {
  std::shared_ptr<SharedRing> last;  // dropped after the lock: may end the ring
  absl::MutexLock lock(&mu_);
  const uint64_t offset = static_cast<uint64_t>(static_cast<uint8_t*>(data) - area_) - kAlign;
  auto it = regions_.find(offset);
  if (it == regions_.end() || !it->second.writer_held) return;  // not ours: never happens
  it->second.writer_held = false;
  placed_bytes_ -= it->second.bytes;
  if (!it->second.published) {
    At(area_, offset)->state.store(kFree, std::memory_order_release);
  }
  if (placed_bytes_ == 0) last = std::move(keep_);
}

std::optional<uint64_t> SharedRing::Publish(const void* data, uint64_t length) {
  if (!Contains(data)) return std::nullopt;
  const auto at = static_cast<uint64_t>(static_cast<const uint8_t*>(data) - area_);
  if (at < kAlign) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(at - kAlign);
  if (it == regions_.end() || !it->second.writer_held || it->second.published ||
      length != it->second.length) {
    return std::nullopt;
  }
  RegionHeader* h = At(area_, it->first);
  h->magic = kRegionMagic ^ it->first;  // rewritten: the reader can write these pages
  h->length = length;
  it->second.published = true;
  h->state.store(kBusy, std::memory_order_release);
  total_payloads.fetch_add(1, std::memory_order_relaxed);
  total_in_place.fetch_add(1, std::memory_order_relaxed);
  return it->first;
}

bool SharedRing::IsPlaced(const void* data, uint64_t length) {
  if (!Contains(data)) return false;
  const auto at = static_cast<uint64_t>(static_cast<const uint8_t*>(data) - area_);
  if (at < kAlign) return false;
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(at - kAlign);
  return it != regions_.end() && it->second.writer_held && !it->second.published &&
         it->second.length == length;
}

bool SharedRing::Contains(const void* data) const {
  const auto* p = static_cast<const uint8_t*>(data);
  return p >= area_ && p < area_ + size_;
}

int64_t SharedRing::TotalPayloads() { return total_payloads.load(std::memory_order_relaxed); }
int64_t SharedRing::TotalFull() { return total_full.load(std::memory_order_relaxed); }
int64_t SharedRing::TotalPublishedInPlace() {
  return total_in_place.load(std::memory_order_relaxed);
}

uint64_t SharedRing::used() {
  absl::MutexLock lock(&mu_);
  ReclaimLocked();
  return used_;
}

absl::StatusOr<std::shared_ptr<SharedRingView>> SharedRingView::Open(const std::string& dir,
                                                                     const std::string& name,
                                                                     uint64_t size,
                                                                     const std::string& token) {
  if (size > (uint64_t{4} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared ring size: ", size, " bytes, at most 4 GiB"));
  }
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(
        "shared ring name: not a bare name of letters, digits and '-'");
  }
  if (token.size() != 16) return absl::InvalidArgumentError("shared ring token: not 16 bytes");
  const std::string path = absl::StrCat(dir, "/", name);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return absl::NotFoundError(Errno(absl::StrCat("opening the peer's shared ring ", path)));
  struct stat st {};
  const uint64_t mapped = kHeaderBytes + size;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != mapped ||
      size % kHeaderBytes != 0 || size == 0) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("the shared ring ", path, " is not of the size its writer announced"));
  }
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED)
    return absl::FailedPreconditionError(Errno(absl::StrCat("mapping ", path)));
  std::shared_ptr<SharedRingView> view(new SharedRingView());
  view->base_ = static_cast<uint8_t*>(base);
  view->area_ = view->base_ + kHeaderBytes;
  view->mapped_ = mapped;
  view->size_ = size;
  const auto* header = reinterpret_cast<const FileHeader*>(view->base_);
  if (std::memcmp(header->magic, kFileMagic, sizeof(kFileMagic)) != 0 || header->size != size ||
      std::memcmp(header->token, token.data(), 16) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shared ring ", path, " is not the peer's (another host's memory?)"));
  }
  // Both sides have it mapped now: the name is no longer needed, and nothing
  // is left behind in the directory if either process dies.
  unlink(path.c_str());
  view->pinned_ = PinHostRange(view->base_, view->mapped_);
  return view;
}

SharedRingView::~SharedRingView() {
  if (pinned_) UnpinHostRange(base_);
  if (base_ != nullptr) munmap(base_, mapped_);
}

absl::Status SharedRingView::Take(uint64_t offset, uint64_t length, std::string* out) {
  return TakeWith(offset, length, [out, length](const uint8_t* bytes) {
    out->assign(reinterpret_cast<const char*>(bytes), length);
  });
}

absl::Status SharedRingView::TakeWith(uint64_t offset, uint64_t length,
                                      const std::function<void(const uint8_t* bytes)>& read) {
  absl::StatusOr<uint8_t*> bytes = Check(offset, length);
  if (!bytes.ok()) return bytes.status();
  read(*bytes);
  At(area_, offset)->state.store(kFree, std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> SharedRingView::Hold(uint64_t offset, uint64_t length) {
  absl::StatusOr<uint8_t*> bytes = Check(offset, length);
  if (!bytes.ok()) return bytes;
  At(area_, offset)->state.store(kHeld, std::memory_order_release);
  held_.fetch_add(length, std::memory_order_relaxed);
  return bytes;
}

void SharedRingView::Release(uint64_t offset, uint64_t length) {
  At(area_, offset)->state.store(kFree, std::memory_order_release);
  held_.fetch_sub(length, std::memory_order_relaxed);
}

absl::StatusOr<uint8_t*> SharedRingView::Check(uint64_t offset, uint64_t length) {
  if (offset % SharedRing::kAlign != 0 || offset >= size_ || length > size_ ||
      RegionBytes(length) > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.shared: offset ", offset, " and length ",
                                                   length, " lie outside the ring of ", size_,
                                                   " bytes"));
  }
  RegionHeader* h = At(area_, offset);
  if (h->magic != (kRegionMagic ^ offset) || h->length != length ||
      h->state.load(std::memory_order_acquire) != kBusy) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.shared: no payload of ", length,
                                                   " bytes at offset ", offset,
                                                   " (stale or taken twice)"));
  }
  return area_ + offset + SharedRing::kAlign;
}

}  // namespace stagewise

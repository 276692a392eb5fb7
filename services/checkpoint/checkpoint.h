// Checkpoint files on disk, without LibTorch (the coordinator links this).
//
// Layout under checkpoint.dir (a path every worker and the coordinator can
// reach: a shared volume in a cluster):
//   <dir>/<job id>/step-<step, 10 digits>/stage-<j>.pt   one shard per stage
//   <dir>/<job id>/step-<step, 10 digits>/MANIFEST       written last
// A step directory is a committed checkpoint only when its MANIFEST parses
// and names every stage once; a shard is usable only when its size and CRC-32
// match the manifest. Everything is written atomically: a temporary file in
// the same directory, fsync, rename, fsync of the directory.
#ifndef STAGEWISE_SERVICES_CHECKPOINT_CHECKPOINT_H_
#define STAGEWISE_SERVICES_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/spec/enums.h"
#include "stagewise/v1/checkpoint.pb.h"

namespace stagewise::checkpoint {

inline constexpr char kManifestName[] = "MANIFEST";
inline constexpr int kFormat = 1;

// <root>/<job_id>
std::string JobDir(const std::string& root, const std::string& job_id);
// <root>/<job_id>/step-0000000120
std::string StepDir(const std::string& root, const std::string& job_id, int64_t step);
// "stage-<j>.pt"
std::string ShardFileName(int stage);

// zlib CRC-32 of `bytes`.
uint32_t Crc32(absl::string_view bytes);

// Creates the parent directories, writes `bytes` to a temporary file beside
// `path` (unique per process and call), fsyncs it, renames it over `path` and
// fsyncs the directory. Nothing is left behind on failure. Errors name the path.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes);
absl::StatusOr<std::string> ReadFile(const std::string& path);

// OK when the file at `path` has exactly `bytes` bytes and CRC-32 `crc32`;
// NOT_FOUND if it is missing, DATA_LOSS naming the file and what differs
// otherwise ("truncated: 1000 of 2048 bytes", "checksum 0x... != 0x...").
absl::Status VerifyFile(const std::string& path, int64_t bytes, uint32_t crc32);
// Like VerifyFile for bytes already read (`what` names them in errors).
absl::Status VerifyBytes(absl::string_view data, int64_t bytes, uint32_t crc32,
                         const std::string& what);

// Writes <step_dir>/MANIFEST atomically, in protobuf text format, after
// removing the corruption marks (MarkCorrupt) of an earlier checkpoint of the
// same step. The caller has checked that the shards are durable.
absl::Status WriteManifest(const std::string& step_dir, const v1::CheckpointManifest& manifest);
// Reads and checks <step_dir>/MANIFEST: NOT_FOUND if there is none (not
// committed), DATA_LOSS if it does not parse, has another format, or its
// shards are not stages 0..n-1 once each.
absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& step_dir);

// A shard's block modes (`modes`, or a manifest's older `block_modes`
// spellings): none, or one per block of the shard. DATA_LOSS otherwise
// (ReadManifest checks every shard with it).
absl::StatusOr<std::vector<BlockMode>> ShardModes(const v1::CheckpointShard& shard);
// Sets a shard's block modes (the typed field).
void SetShardModes(const std::vector<BlockMode>& modes, v1::CheckpointShard* shard);

struct Committed {
  std::string dir;  // the step directory
  v1::CheckpointManifest manifest;
  int64_t bytes = 0;  // all shards
};

// The committed checkpoints of a job, newest (highest step) first. Step
// directories without a MANIFEST (uncommitted), with a bad one, or whose
// shards are missing or of the wrong size are skipped, with one line each in
// `*skipped` if given ("step-0000000120: no MANIFEST (not committed)"). With
// `verify_checksums` the CRC-32 of every shard is checked too (reads every
// byte). A missing job directory is no checkpoints, not an error.
std::vector<Committed> ListCommitted(const std::string& root, const std::string& job_id,
                                     bool verify_checksums, std::vector<std::string>* skipped);

// Renames <step_dir>/MANIFEST to MANIFEST.corrupt and writes `reason` to
// <step_dir>/CORRUPT, so no later listing (even after a restart) offers it.
absl::Status MarkCorrupt(const std::string& step_dir, const std::string& reason);

// Keeps the newest `keep` committed checkpoints of the job and removes the
// older ones, every uncommitted step directory older than the newest
// committed checkpoint, every file in a kept checkpoint that its manifest
// does not list, and shards (stage-*) directly in the job directory. Returns
// the removed paths.
absl::StatusOr<std::vector<std::string>> Prune(const std::string& root, const std::string& job_id,
                                               int keep);

// Creates `dir` (and parents) and writes and removes a probe file in it:
// FAILED_PRECONDITION "checkpoint.dir: cannot write <dir>: <why>" otherwise.
absl::Status ProbeWritable(const std::string& dir);

}  // namespace stagewise::checkpoint

#endif  // STAGEWISE_SERVICES_CHECKPOINT_CHECKPOINT_H_

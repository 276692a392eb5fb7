// How one coordinator's pool of workers is shared (docs/operations.md,
// "Sharing the cluster"): priority classes, per-owner quotas and weights.
// Read from the file --scheduling-config names; every error names the key
// path ("owners.alice.weight: must be > 0, got -1").
//
//   classes:                  # highest first
//     - name: production      # preempt: true (default) lets its waiting
//       owners: [alice, ci]   # who may name it (default: everyone)
//     - name: research        # jobs stop running jobs of lower classes
//     - {name: batch, preempt: false}
//   default_class: research   # a job without `priority:` (default: the last)
//   owners:                   # by token name (`anonymous`: no token)
//     alice: {weight: 1, max_workers: 8, max_running_jobs: 4}
//     carol: {weight: 2}
//   default_owner: {weight: 1}
//   pool_workers: 16          # optional: quotas are checked against it
//   fair_share: {half_life_seconds: 3600}
//
// Without a file there is one class, every owner has weight 1 and no quota:
// the queue is first come, first served with backfill, as before.
#ifndef STAGEWISE_SERVICES_SPEC_SHARING_H_
#define STAGEWISE_SERVICES_SPEC_SHARING_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stagewise {

struct SharingConfig {
  struct Class {
    std::string name;
    // Its waiting jobs may stop running jobs of lower classes (planned stop).
    bool preempt = true;
    // The owners who may name it (empty: everyone).
    std::vector<std::string> owners;
  };
  std::vector<Class> classes;  // highest first; empty: one unnamed class
  std::string default_class;   // a job without `priority:`; "" with no classes
  struct Owner {
    double weight = 1;           // fair share: > 0
    int max_workers = 0;         // workers held at once (0: no limit)
    int max_running_jobs = 0;    // jobs holding workers at once (0: no limit)
    std::set<std::string> keys;  // the keys its own entry sets (for errors)
  };
  std::map<std::string, Owner> owners;  // by token name
  Owner default_owner;
  int pool_workers = 0;             // 0: not declared
  double half_life_seconds = 3600;  // fair_share: how fast past use is forgotten

  // The owner's entry (default_owner for one not listed). "" is `anonymous`.
  const Owner& OwnerOf(const std::string& owner) const;
  // The class's rank, 0 the highest; the default class's for "". NOT_FOUND
  // for an unknown class, naming the classes there are and `key` (the spec
  // key that named it).
  absl::StatusOr<int> RankOf(const std::string& class_name,
                             const std::string& key = "priority") const;
  // OK when `owner` may name the class of `rank`; PERMISSION_DENIED naming
  // `priority` and the class's owners otherwise.
  absl::Status CheckOpenTo(int rank, const std::string& owner) const;
  // Where the owner's `field` (max_workers, ...) comes from, for errors:
  // "owners.alice.max_workers" or "default_owner.max_workers".
  std::string QuotaKey(const std::string& owner, const std::string& field) const;
  // The class's name for a rank ("" with no classes).
  std::string NameOf(int rank) const;
  bool Preempts(int rank) const;
};

struct JobSpec;
// A submitted job against the config: its `priority` names a class, and its
// owner's max_workers leaves room for its smallest placement (stages x
// replicas, or fewer with recovery.elastic / recovery.min_stages).
// INVALID_ARGUMENT naming the key otherwise.
absl::Status CheckJobAgainst(const SharingConfig& config, const JobSpec& spec,
                             const std::string& owner);

// The token name an owner is listed under: "anonymous" for "".
std::string OwnerKey(const std::string& owner);

// Parses a scheduling config; errors name the key (INVALID_ARGUMENT).
absl::StatusOr<SharingConfig> ParseSharingConfig(const std::string& yaml_text);
// Reads and parses the file; errors start with its path.
absl::StatusOr<SharingConfig> LoadSharingConfig(const std::string& path);

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_SPEC_SHARING_H_

// What the profiler measured of one model at one batch size on one device:
// per block, times (medians of repeated runs after warm-up) and bytes (counted
// by the CPU memory meter). Plain data, no LibTorch: the planner, the
// coordinator and the CLI read it; services/profiler/profiler.h fills it.
#ifndef STAGEWISE_SERVICES_PLANNER_PROFILE_H_
#define STAGEWISE_SERVICES_PLANNER_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stagewise::planner {

// One block, one mini-batch. Times in seconds, memory in bytes.
struct BlockProfile {
  int index = 0;
  std::string kind;
  bool reversible = false;
  double forward_s = 0;           // forward keeping the graph (store mode)
  double forward_nograd_s = 0;    // forward without a graph (rebuild mode, PETRA, delayed)
  double backward_s = 0;          // VJP through the kept graph
  double rebuild_backward_s = 0;  // reversible: rebuild the input from the output + VJP
  double inverse_s = 0;           // reversible: the inverse alone, without a graph
  double step_s = 0;              // optimizer step over the block's parameters
  double message_s = 0;           // encode + decode of the block's output (one message)
  double aux_head_s = 0;          // nwise aux head on the output: forward + backward + step
  int64_t input_bytes = 0;
  int64_t output_bytes = 0;
  int64_t graph_bytes = 0;               // kept by the graph in store mode, input and output aside
  int64_t forward_transient_bytes = 0;   // above what the forward keeps, while it runs
  int64_t backward_transient_bytes = 0;  // above what was live, during the store backward
  int64_t rebuild_transient_bytes = 0;   // above what was live, during the rebuild backward
  int64_t parameter_bytes = 0;           // trainable parameters
  int64_t buffer_bytes = 0;              // BatchNorm statistics
  int64_t optimizer_bytes = 0;           // optimizer state (momentum, Adam moments)
};

struct ModelProfile {
  std::string key;    // cache key: model, batch size, device, threads
  std::string model;  // e.g. "revnet-18 width 16"
  int64_t batch_size = 0;
  std::string device;       // "cpu", "cuda:0"
  int threads = 0;          // LibTorch intra-op threads while profiling
  int repeats = 0;          // timed rounds per figure (the lower quartile is kept)
  int64_t label_bytes = 0;  // labels of one mini-batch
  std::string aux_head;     // aux head the aux_head_s column was measured with ("" = none)
  std::vector<BlockProfile> blocks;
};

// A line-oriented text form (the profile cache's file format); Parse accepts
// exactly what Serialize writes and names the bad line otherwise.
std::string SerializeProfile(const ModelProfile& profile);
absl::StatusOr<ModelProfile> ParseProfile(const std::string& text);

}  // namespace stagewise::planner

#endif  // STAGEWISE_SERVICES_PLANNER_PROFILE_H_

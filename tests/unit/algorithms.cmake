# Unit tests of the algorithms area (included from CMakeLists.txt).
stagewise_add_test(NAME algorithms_test SOURCES algorithms_test.cc fake_stage_context.cc trace_test.cc
  delay_corrections_test.cc weight_version_test.cc
  stage_shards_test.cc
  wire_formats_test.cc
  LIBS stagewise_worker stagewise_training LABELS unit TORCH)
stagewise_add_test(NAME collective_test SOURCES collective_test.cc
  LIBS stagewise_worker stagewise_collective LABELS unit TORCH)
stagewise_add_test(NAME device_turns_test SOURCES device_turns_test.cc
  LIBS stagewise_device_turns LABELS unit)
stagewise_add_test(NAME reshard_test SOURCES reshard_test.cc
  LIBS stagewise_worker stagewise_training LABELS unit TORCH)
# The stage runtime's lifecycle (start, stop, failure racing) without gRPC.
stagewise_add_test(NAME stage_runtime_test SOURCES stage_runtime_test.cc same_host_test.cc
  stage_phases_test.cc
  LIBS stagewise_worker LABELS unit TORCH)
# What a stage reports to the coordinator (pacing, mean loss, result, errors).
stagewise_add_test(NAME stage_reporter_test SOURCES stage_reporter_test.cc
  LIBS stagewise_worker LABELS unit TORCH)

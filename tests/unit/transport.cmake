# Unit tests of the transport area (included from CMakeLists.txt).
stagewise_add_test(NAME outbox_test SOURCES outbox_test.cc
  LIBS stagewise_rpc LABELS unit)
stagewise_add_test(NAME bounded_queue_test SOURCES bounded_queue_test.cc
  LIBS stagewise_log absl::synchronization absl::time LABELS unit)
stagewise_add_test(NAME stream_gate_test SOURCES stream_gate_test.cc
  LIBS stagewise_stream_gate LABELS unit)
stagewise_add_test(NAME peer_stream_test SOURCES peer_stream_test.cc neighbour_link_test.cc link_delay_test.cc
  send_pipe_test.cc
  LIBS stagewise_worker LABELS unit TORCH)
stagewise_add_test(NAME security_test SOURCES security_test.cc token_file_test.cc
  LIBS stagewise_security LABELS unit)
# Its own binary: the host block cache becomes the process's CPU allocator.
stagewise_add_test(NAME output_placement_test SOURCES output_placement_test.cc
  LIBS stagewise_worker LABELS unit TORCH)

# Unit tests of the coordinator area (included from CMakeLists.txt): the
# transport-free parts with fakes (no gRPC, no real workers).
stagewise_add_test(NAME worker_registry_test SOURCES worker_registry_test.cc
  LIBS stagewise_job_manager LABELS unit)
stagewise_add_test(NAME scheduler_test SOURCES scheduler_test.cc
  LIBS stagewise_job_manager LABELS unit)
stagewise_add_test(NAME job_manager_test SOURCES job_manager_test.cc
  LIBS stagewise_job_manager LABELS unit)
stagewise_add_test(NAME coordinator_units_test SOURCES coordinator_units_test.cc end_cause_test.cc
  job_placement_test.cc
  stage_replacement_test.cc
  LIBS stagewise_job_manager LABELS unit)
stagewise_add_test(NAME collective_store_test SOURCES collective_store_test.cc task_loop_test.cc
  LIBS stagewise_job_manager LABELS unit)
# The status pages' HTML (docs/status_page.md); the browser test is
# tests/browser.
stagewise_add_test(NAME status_page_test SOURCES status_page_test.cc
  LIBS stagewise_status_page LABELS unit)
# services/render: the drawing the CLI's files and the status pages share.
stagewise_add_test(NAME render_test SOURCES render_test.cc
  LIBS stagewise_status_page stagewise_cli_trace LABELS unit)
# Priority classes, quotas, fair share and preemption (docs/operations.md).
stagewise_add_test(NAME sharing_test SOURCES sharing_test.cc
  LIBS stagewise_job_manager LABELS unit)

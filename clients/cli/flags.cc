#include "clients/cli/flags.h"

namespace stagewise::cli {

void AddSetOption(CLI::App* command, std::vector<std::string>& sets) {
  command
      ->add_option("--set", sets,
                   "Override a key of the job file: KEY.PATH=VALUE, the value read as YAML "
                   "(repeatable; e.g. --set data.limit_test=256 --set optimizer.lr=0.05)")
      ->type_name("KEY=VALUE")
      ->expected(1)
      ->allow_extra_args(false)
      ->take_all();
}

void AddOutputOption(CLI::App* command, std::string& output, const char* what) {
  command->add_option("-o,--output", output, what)
      ->check(CLI::IsMember({"text", "json", "yaml"}))
      ->capture_default_str();
}

}  // namespace stagewise::cli

// clients/cli/conventions.h: the closest command, the command word, -o yaml
// and the completion script (run by a real bash).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "clients/cli/config_file.h"
#include "clients/cli/conventions.h"
#include "clients/cli/devices.h"

namespace stagewise::cli {
namespace {

TEST(EditDistance, CountsInsertionsDeletionsAndSubstitutions) {
  EXPECT_EQ(EditDistance("", ""), 0);
  EXPECT_EQ(EditDistance("status", "status"), 0);
  EXPECT_EQ(EditDistance("stats", "status"), 1);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
  EXPECT_EQ(EditDistance("", "abc"), 3);
}

TEST(ClosestName, SuggestsOnlyWhatIsClose) {
  const std::vector<std::string> commands = {"submit", "status", "list", "watch", "workers"};
  EXPECT_EQ(ClosestName("stats", commands), "status");
  EXPECT_EQ(ClosestName("sumbit", commands), "submit");
  EXPECT_EQ(ClosestName("wor", commands), "workers");  // a prefix
  EXPECT_EQ(ClosestName("xyzzy", commands), "");
  EXPECT_EQ(ClosestName("", commands), "");
}

// The shape of the real CLI: global options with and without values.
std::unique_ptr<CLI::App> SmallApp() {
  auto app = std::make_unique<CLI::App>("test");
  static std::string coordinator, job, out = "text";
  static bool insecure = false;
  app->add_option("--coordinator", coordinator, "address");
  app->add_flag("--insecure", insecure, "plain text");
  auto* status = app->add_subcommand("status", "one job");
  status->add_option("job_id", job, "Job id");
  status->add_option("-o,--output", out, "format");
  app->add_subcommand("list", "jobs");
  static std::string context, job_file;
  app->add_option("--context", context, "context");
  app->add_subcommand("run", "a job file")->add_option("job", job_file, "Job spec");
  return app;
}

TEST(CommandWord, SkipsGlobalOptionsAndTheirValues) {
  auto app = SmallApp();
  EXPECT_EQ(CommandWord(*app, {"status", "j1"}), "status");
  EXPECT_EQ(CommandWord(*app, {"--coordinator", "h:1", "nosuch", "--help"}), "nosuch");
  EXPECT_EQ(CommandWord(*app, {"--coordinator=h:1", "list"}), "list");
  EXPECT_EQ(CommandWord(*app, {"--insecure", "list"}), "list");
  EXPECT_EQ(CommandWord(*app, {"--help"}), "");
  EXPECT_EQ(CommandWord(*app, {}), "");
  EXPECT_EQ(CommandNames(*app), (std::vector<std::string>{"status", "list", "run"}));
}

TEST(IsFileSource, PathsAndExistingFilesAreFilesJobIdsAreNot) {
  EXPECT_TRUE(IsFileSource("./nonexist.tsv"));
  EXPECT_TRUE(IsFileSource("x.json"));
  EXPECT_TRUE(IsFileSource("runs/a"));
  EXPECT_TRUE(IsFileSource("/"));
  EXPECT_FALSE(IsFileSource("job-1a2b3c4d"));
  EXPECT_FALSE(IsFileSource("nosuchjob"));
}

// Unknown commands at every depth: the top, and inside a command that has
// commands; a command's positional arguments are not commands.
TEST(FindUnknownCommand, LooksAtEveryLevelThatHasCommands) {
  auto app = SmallApp();
  static std::string name;
  auto* config = app->add_subcommand("config", "contexts");
  config->add_subcommand("use-context", "use one")->add_option("name", name, "Context");
  config->add_subcommand("get-contexts", "list");
  EXPECT_FALSE(FindUnknownCommand(*app, {"status", "j1"}).has_value());
  EXPECT_FALSE(FindUnknownCommand(*app, {"config", "use-context", "prod"}).has_value());
  EXPECT_FALSE(FindUnknownCommand(*app, {"--coordinator", "h:1", "config", "get-contexts"}));
  EXPECT_FALSE(FindUnknownCommand(*app, {"config", "--help"}).has_value());
  auto top = FindUnknownCommand(*app, {"--coordinator", "h:1", "stats", "--help"});
  ASSERT_TRUE(top.has_value());
  EXPECT_EQ(top->parent, "");
  EXPECT_EQ(top->word, "stats");
  EXPECT_EQ(top->closest, "status");
  auto deep = FindUnknownCommand(*app, {"config", "use-contex", "prod"});
  ASSERT_TRUE(deep.has_value());
  EXPECT_EQ(deep->parent, "config");
  EXPECT_EQ(deep->word, "use-contex");
  EXPECT_EQ(deep->closest, "use-context");
  auto none = FindUnknownCommand(*app, {"--insecure", "config", "nosuch", "--help"});
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->word, "nosuch");
  EXPECT_EQ(none->closest, "");
}

TEST(JsonToYaml, KeepsTypesAndStrings) {
  auto y = JsonToYaml(R"({"job":"123","steps":40,"ok":true,"acc":0.5,"name":"true",)"
                      R"("tags":["a","b"],"none":null,"empty":"","inf":".inf","nan":".NaN",)"
                      R"("sci":"1e3","neg":"-1","odd key":1,"no":"no"})");
  ASSERT_TRUE(y.ok()) << y.status();
  const YAML::Node n = YAML::Load(*y);
  EXPECT_EQ(n["job"].as<std::string>(), "123");
  EXPECT_EQ(n["job"].Tag(), "!") << *y;  // quoted: reads back as a string
  EXPECT_EQ(n["name"].Tag(), "!") << *y;
  EXPECT_EQ(n["steps"].as<int>(), 40);
  EXPECT_TRUE(n["ok"].as<bool>());
  EXPECT_DOUBLE_EQ(n["acc"].as<double>(), 0.5);
  EXPECT_EQ(n["tags"].size(), 2u);
  EXPECT_TRUE(n["none"].IsNull());
  EXPECT_EQ(n["empty"].as<std::string>(), "");
  // Strings a YAML reader would take for numbers or booleans stay strings.
  for (const char* key : {"inf", "nan", "sci", "neg", "no"}) {
    EXPECT_EQ(n[key].Tag(), "!") << key << "\n" << *y;
  }
  EXPECT_EQ(n["inf"].as<std::string>(), ".inf");
  EXPECT_EQ(n["odd key"].as<int>(), 1);
}

TEST(JsonToYaml, OneDocumentPerLine) {
  auto y = JsonToYaml("{\"step\":1}\n{\"step\":2}\n");
  ASSERT_TRUE(y.ok()) << y.status();
  const std::vector<YAML::Node> docs = YAML::LoadAll(*y);
  ASSERT_EQ(docs.size(), 2u) << *y;
  EXPECT_EQ(docs[1]["step"].as<int>(), 2);
  auto bad = JsonToYaml("{\"step\":1}\n{oops\n");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status();
}

// What bash completes for the words typed so far (the last may be partial).
std::string Complete(const std::string& script, const std::string& words, int cword) {
  const std::string dir = ::testing::TempDir();
  const std::string file = dir + "/stagewise-completion-" + std::to_string(::getpid());
  std::ofstream(file) << script << "COMP_WORDS=(" << words << ")\nCOMP_CWORD=" << cword
                      << "\n_stagewise\necho \"${COMPREPLY[*]}\"\n";
  std::string out;
  if (FILE* p = ::popen(("bash " + file + " 2>&1").c_str(), "r")) {
    char buf[512];
    while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    ::pclose(p);
  }
  std::filesystem::remove(file);
  return out;
}

TEST(Complete, OffersCommandsOptionsValuesAndJobIds) {
  auto app = SmallApp();
  CompletionSources sources;
  sources.job_ids = [] { return std::vector<std::string>{"job-0000002a", "job-0000002b"}; };
  sources.contexts = [] { return std::vector<std::string>{"prod", "staging"}; };
  const auto words = [&](std::vector<std::string> line) {
    return Complete(*app, line, sources).words;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(words({"st"}), V{"status"});
  EXPECT_EQ(words({"--coordinator", "h:1", "l"}), V{"list"});
  EXPECT_EQ(words({"status", "--o"}), V{"--output"});
  EXPECT_EQ(words({"status", "-o", ""}), (V{"text", "json", "yaml"}));
  EXPECT_EQ(words({"status", "--output", "j"}), V{"json"});
  EXPECT_EQ(words({"status", ""}), (V{"job-0000002a", "job-0000002b"}));
  EXPECT_EQ(words({"status", "job-0000002b", ""}), (V{"job-0000002a", "job-0000002b"}));
  EXPECT_EQ(words({"--coordinator", ""}), V{});  // an address: nothing to offer
  EXPECT_EQ(words({"--context", "s"}), V{"staging"});
  const std::vector<std::string> options = words({"status", "--"});
  EXPECT_NE(std::find(options.begin(), options.end(), "--coordinator"), options.end());  // global
  EXPECT_TRUE(Complete(*app, {"run", ""}, sources).files);  // a job file
  EXPECT_FALSE(Complete(*app, {"status", ""}, sources).files);
  EXPECT_EQ(CompletionText(Complete(*app, {"status", "-o", "y"}, sources)), "words\nyaml\n");
}

TEST(CompletionScript, BashAsksTheBinaryAndOffersFilesWhenItSaysSo) {
  auto script = CompletionScript("bash");
  ASSERT_TRUE(script.ok()) << script.status();
  // A stand-in binary: the reply of `__complete` for the words it is given.
  const std::string fake =
      "stagewise() { [[ $1 == __complete ]] || return 1; shift;\n"
      "  if [[ $1 == status ]]; then printf 'words\\njob-0000002a\\njob-0000002b\\n';\n"
      "  else printf 'files\\n'; fi; }\n";
  EXPECT_EQ(Complete(fake + *script, "stagewise status job-0000002", 2),
            "job-0000002a job-0000002b\n");
  const std::string dir = ::testing::TempDir() + "/stagewise-complete-files";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/job.yaml") << "name: x\n";
  EXPECT_EQ(Complete(fake + *script, "stagewise run " + dir + "/jo", 2), dir + "/job.yaml\n");
  std::filesystem::remove_all(dir);
  for (const char* shell : {"zsh", "fish"}) {
    auto other = CompletionScript(shell);
    ASSERT_TRUE(other.ok()) << shell;
    EXPECT_NE(other->find("__complete"), std::string::npos) << shell;
  }
  EXPECT_NE(CompletionScript("zsh")->find("bashcompinit"), std::string::npos);
  EXPECT_FALSE(CompletionScript("tcsh").ok());
}

// The config file in a temporary $STAGEWISE_CONFIG, restored afterwards.
class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("stagewise-config-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    path_ = (dir_ / "sub" / "config.yaml").string();
    ::setenv("STAGEWISE_CONFIG", path_.c_str(), 1);
    if (const char* home = std::getenv("HOME")) home_ = home;
  }
  void TearDown() override {
    ::unsetenv("STAGEWISE_CONFIG");
    ::setenv("HOME", home_.c_str(), 1);
    std::filesystem::remove_all(dir_);
  }
  int Run(ConfigArgs args, std::string* out = nullptr, std::string* err = nullptr) {
    std::ostringstream o, e;
    const int rc = ConfigCommand(args, o, e);
    if (out) *out = o.str();
    if (err) *err = e.str();
    return rc;
  }
  std::filesystem::path dir_;
  std::string path_;
  std::string home_;
};

TEST_F(ConfigFileTest, SetUseAndDeleteContextsRoundTripThroughTheFile) {
  EXPECT_EQ(ConfigPath(), path_);
  auto empty = LoadConfig(path_);
  ASSERT_TRUE(empty.ok()) << empty.status();  // no file: no contexts
  EXPECT_TRUE(empty->contexts.empty());

  ConfigArgs prod{"set-context", "prod", {}, {"coordinator", "token-file", "tls-ca"}};
  prod.set.coordinator = "stagewise.example.com:7070";
  prod.set.token_file = "/secrets/prod.token";
  prod.set.tls_ca = "/secrets/ca.pem";
  std::string out;
  ASSERT_EQ(Run(prod, &out), 0);
  EXPECT_NE(out.find("created context prod (current)"), std::string::npos) << out;
  ConfigArgs laptop{"set-context", "laptop", {}, {"coordinator", "insecure"}};
  laptop.set.coordinator = "127.0.0.1:7070";
  laptop.set.insecure = true;
  ASSERT_EQ(Run(laptop), 0);
  EXPECT_EQ(std::filesystem::status(path_).permissions() & std::filesystem::perms::others_read,
            std::filesystem::perms::none);

  auto config = LoadConfig(path_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->current_context, "prod");  // the first one stays current
  EXPECT_EQ(config->contexts.at("prod").tls_ca, "/secrets/ca.pem");
  EXPECT_TRUE(config->contexts.at("laptop").insecure);
  ASSERT_EQ(Run({"use-context", "laptop", {}, {}}), 0);
  auto selected = SelectContext(*LoadConfig(path_), "");
  ASSERT_TRUE(selected.ok());
  EXPECT_EQ((*selected)->coordinator, "127.0.0.1:7070");
  ASSERT_EQ(Run({"current-context", "", {}, {}}, &out), 0);
  EXPECT_EQ(out, "laptop\n");
  ASSERT_EQ(Run({"get-contexts", "", {}, {}}, &out), 0);
  EXPECT_NE(out.find("*        laptop"), std::string::npos) << out;
  EXPECT_NE(out.find("/secrets/prod.token"), std::string::npos) << out;

  // Updating keeps the fields not given.
  ConfigArgs moved{"set-context", "prod", {}, {"coordinator"}};
  moved.set.coordinator = "new.example.com:7070";
  ASSERT_EQ(Run(moved), 0);
  EXPECT_EQ(LoadConfig(path_)->contexts.at("prod").token_file, "/secrets/prod.token");

  std::string err;
  EXPECT_EQ(Run({"use-context", "nosuch", {}, {}}, nullptr, &err), 2);
  EXPECT_NE(err.find("context 'nosuch' is not in"), std::string::npos) << err;
  EXPECT_NE(err.find("contexts: laptop, prod"), std::string::npos) << err;
  ASSERT_EQ(Run({"delete-context", "laptop", {}, {}}), 0);
  EXPECT_TRUE(LoadConfig(path_)->current_context.empty());
}

TEST_F(ConfigFileTest, ABadFileIsRefusedNamingTheKey) {
  std::filesystem::create_directories(dir_ / "sub");
  std::ofstream(path_) << "contexts:\n  prod:\n    coordinater: x:1\n";
  auto bad = LoadConfig(path_);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("contexts.prod.coordinater: unknown key"),
            std::string::npos)
      << bad.status();
  std::ofstream(path_) << "current-context: gone\ncontexts: {a: {coordinator: x:1}}\n";
  EXPECT_NE(LoadConfig(path_).status().message().find("'gone' is not among the contexts"),
            std::string::npos);
  std::ofstream(path_) << "contexts: {a: {token-file: ~/t}}\n";
  ::setenv("HOME", "/home/someone", 1);
  auto home = LoadConfig(path_);
  ASSERT_TRUE(home.ok()) << home.status();
  EXPECT_EQ(home->contexts.at("a").token_file, "/home/someone/t");
}

TEST_F(ConfigFileTest, TokenFilesAreTrimmedAndMustHoldAToken) {
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ / "token") << "  secret-token-1234567890\n";
  auto token = ReadTokenFile((dir_ / "token").string());
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "secret-token-1234567890");
  std::ofstream(dir_ / "empty") << "\n";
  EXPECT_FALSE(ReadTokenFile((dir_ / "empty").string()).ok());
  EXPECT_FALSE(ReadTokenFile((dir_ / "missing").string()).ok());
}

}  // namespace
}  // namespace stagewise::cli

namespace stagewise::cli {
namespace {

TEST(LocalWorkerDevices, FollowTheJobOrTheFlagAndRefuseGpusThatAreNotThere) {
  using V = std::vector<std::string>;
  EXPECT_EQ(*LocalWorkerDevices("cpu", {}, 3, 0), (V{"cpu", "cpu", "cpu"}));
  EXPECT_EQ(*LocalWorkerDevices("cpu", {}, 2, 4), (V{"cpu", "cpu"}));
  // `cuda` spreads the workers over the GPUs; cuda:K puts them all there.
  EXPECT_EQ(*LocalWorkerDevices("cuda", {}, 5, 2),
            (V{"cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"}));
  EXPECT_EQ(*LocalWorkerDevices("cuda:1", {}, 2, 2), (V{"cuda:1", "cuda:1"}));
  // --devices wins over the job and is cycled.
  EXPECT_EQ(*LocalWorkerDevices("cuda", {"cpu", "cpu"}, 3, 0), (V{"cpu", "cpu", "cpu"}));
  EXPECT_EQ(*LocalWorkerDevices("cpu", {"cuda:1", "cpu"}, 3, 2), (V{"cuda:1", "cpu", "cuda:1"}));

  // No GPU here: the error names the key (or the flag).
  for (const char* device : {"cuda", "cuda:0"}) {
    absl::StatusOr<V> none = LocalWorkerDevices(device, {}, 2, 0);
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(none.status().message(), "device: ")) << none.status();
    EXPECT_NE(none.status().message().find("no CUDA device"), std::string::npos);
  }
  absl::StatusOr<V> missing = LocalWorkerDevices("cuda:2", {}, 1, 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cuda:0 to cuda:1"), std::string::npos)
      << missing.status();
  for (const V& flag : {V{"cuda:0"}, V{"gpu"}, V{"cuda"}, V{"cuda:-1"}}) {
    absl::StatusOr<V> bad = LocalWorkerDevices("cpu", flag, 2, 0);
    ASSERT_FALSE(bad.ok()) << flag[0];
    EXPECT_TRUE(absl::StartsWith(bad.status().message(), "--devices: ")) << bad.status();
  }
  EXPECT_FALSE(LocalWorkerDevices("tpu", {}, 1, 0).ok());
}

}  // namespace
}  // namespace stagewise::cli

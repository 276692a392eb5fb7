// Child-process supervision for `stagewise local`: real /bin/sh children.
#include "clients/cli/process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace stagewise::cli {
namespace {
namespace fs = std::filesystem;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// No child of this process is left, not even a zombie.
void ExpectNoChildren() {
  errno = 0;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

// True once `pid` is gone or a zombie of someone else (e.g. reparented to an
// init that has not reaped it yet): either way, no longer running.
bool GoneWithin(pid_t pid, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string content;
    if (!std::getline(stat, content)) return true;
    const size_t paren = content.rfind(')');
    if (paren != std::string::npos && paren + 2 < content.size() && content[paren + 2] == 'Z') {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// Waits until `path` holds some text (a script's "I am ready" marker).
std::string WaitForText(const fs::path& path, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    std::string text = Slurp(path);
    if (!text.empty() && text.back() == '\n') return text;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return "";
}

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("stagewise_process_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    ExpectNoChildren();
    fs::remove_all(dir_);
  }

  std::unique_ptr<Child> Sh(const std::string& script, const std::string& log = "child.log") {
    absl::StatusOr<std::unique_ptr<Child>> child =
        Child::Spawn({"/bin/sh", "-c", script}, (dir_ / log).string());
    EXPECT_TRUE(child.ok()) << child.status();
    return child.ok() ? std::move(*child) : nullptr;
  }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(ProcessTest, WaitForPortFileReturnsThePortsOnceWritten) {
  const std::string port_file = P("c.port");
  auto child = Sh(absl::StrCat("sleep 0.3; printf '4242 4343\\n' > ", port_file, ".tmp; mv ",
                               port_file, ".tmp ", port_file, "; exec sleep 100"));
  ASSERT_NE(child, nullptr);
  EXPECT_FALSE(fs::exists(port_file));  // the wait below really waits
  absl::StatusOr<Ports> ports = WaitForPortFile(port_file, absl::Seconds(30), *child);
  ASSERT_TRUE(ports.ok()) << ports.status();
  EXPECT_EQ(ports->grpc, 4242);
  EXPECT_EQ(ports->metrics, 4343);
  EXPECT_TRUE(child->IsRunning());
  EXPECT_TRUE(child->Terminate(absl::Seconds(10)).ok());
  EXPECT_FALSE(child->IsRunning());
}

TEST_F(ProcessTest, ChildExitingBeforeItsPortFileIsAnErrorWithItsExitCode) {
  auto child = Sh("echo 'fatal: cannot open the database'; exit 3");
  ASSERT_NE(child, nullptr);
  absl::StatusOr<Ports> ports = WaitForPortFile(P("never.port"), absl::Seconds(30), *child);
  ASSERT_FALSE(ports.ok());
  EXPECT_EQ(ports.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ports.status().message().find("exited with code 3"), std::string::npos)
      << ports.status();
  EXPECT_NE(ports.status().message().find("sh (pid "), std::string::npos) << ports.status();
  ASSERT_TRUE(child->ExitStatus().has_value());
  EXPECT_TRUE(WIFEXITED(*child->ExitStatus()));
  EXPECT_EQ(WEXITSTATUS(*child->ExitStatus()), 3);
  EXPECT_EQ(child->DescribeExit(), "exited with code 3");
  EXPECT_EQ(TailFile(child->log_path(), 5), "fatal: cannot open the database");
}

TEST_F(ProcessTest, WaitForPortFileTimesOut) {
  auto child = Sh("exec sleep 100");
  ASSERT_NE(child, nullptr);
  absl::StatusOr<Ports> ports = WaitForPortFile(P("never.port"), absl::Milliseconds(200), *child);
  EXPECT_EQ(ports.status().code(), absl::StatusCode::kDeadlineExceeded) << ports.status();
  EXPECT_NE(ports.status().message().find("never.port"), std::string::npos);
  EXPECT_TRUE(child->IsRunning());
}

TEST_F(ProcessTest, WaitForPortFileStopsWhenAborted) {
  auto child = Sh("exec sleep 100");
  ASSERT_NE(child, nullptr);
  std::atomic<bool> abort{false};
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    abort = true;
  });
  absl::StatusOr<Ports> ports = WaitForPortFile(P("never.port"), absl::Seconds(60), *child, &abort);
  aborter.join();
  EXPECT_EQ(ports.status().code(), absl::StatusCode::kCancelled) << ports.status();
}

TEST_F(ProcessTest, MalformedPortFileIsReported) {
  const std::string port_file = P("bad.port");
  std::ofstream(port_file) << "hello world\n";
  auto child = Sh("exec sleep 100");
  ASSERT_NE(child, nullptr);
  absl::StatusOr<Ports> ports = WaitForPortFile(port_file, absl::Milliseconds(200), *child);
  EXPECT_EQ(ports.status().code(), absl::StatusCode::kDataLoss) << ports.status();
  EXPECT_NE(ports.status().message().find("hello world"), std::string::npos) << ports.status();
}

TEST(PortFile, Parses) {
  absl::StatusOr<Ports> ports = ParsePortFile("7070 9090\n");
  ASSERT_TRUE(ports.ok());
  EXPECT_EQ(ports->grpc, 7070);
  EXPECT_EQ(ports->metrics, 9090);
  EXPECT_FALSE(ParsePortFile("").ok());
  EXPECT_FALSE(ParsePortFile("7070").ok());
  EXPECT_FALSE(ParsePortFile("0 9090").ok());
  EXPECT_FALSE(ParsePortFile("70000 9090").ok());
  EXPECT_FALSE(ParsePortFile("7070 9090 1").ok());
  EXPECT_FALSE(ParsePortFile("a b").ok());
}

TEST_F(ProcessTest, TerminateEscalatesToSigkillForAChildIgnoringSigterm) {
  const std::string pid_file = P("grandchild.pid");
  // The shell and its background sleep both ignore SIGTERM.
  auto child = Sh(absl::StrCat("trap '' TERM; sleep 100 & echo $! > ", pid_file, "; wait"));
  ASSERT_NE(child, nullptr);
  const std::string grandchild = WaitForText(pid_file, absl::Seconds(10));
  ASSERT_FALSE(grandchild.empty()) << "the script never started";
  const absl::Time start = absl::Now();
  EXPECT_TRUE(child->Terminate(absl::Milliseconds(300)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // not the sleep's 100 s
  EXPECT_FALSE(child->IsRunning());
  ASSERT_TRUE(child->ExitStatus().has_value());
  ASSERT_TRUE(WIFSIGNALED(*child->ExitStatus())) << child->DescribeExit();
  EXPECT_EQ(WTERMSIG(*child->ExitStatus()), SIGKILL);
  EXPECT_NE(child->DescribeExit().find("killed by signal 9"), std::string::npos);
  // The whole process group went, not just the shell.
  EXPECT_TRUE(GoneWithin(std::atoi(grandchild.c_str()), absl::Seconds(5)));
}

TEST_F(ProcessTest, TerminateUsesSigtermFirst) {
  auto child = Sh("exec sleep 100");
  ASSERT_NE(child, nullptr);
  EXPECT_TRUE(child->Terminate(absl::Seconds(10)).ok());
  ASSERT_TRUE(child->ExitStatus().has_value());
  ASSERT_TRUE(WIFSIGNALED(*child->ExitStatus()));
  EXPECT_EQ(WTERMSIG(*child->ExitStatus()), SIGTERM);
  EXPECT_TRUE(child->Terminate(absl::Seconds(1)).ok());  // again: a no-op
}

TEST_F(ProcessTest, ChildGetsItsOwnGroupAndAnEmptySignalMask) {
  // The CLI may block signals in its threads; the child must not inherit that.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &term, &old), 0);
  auto child = Sh("exec sleep 100");
  ASSERT_EQ(::pthread_sigmask(SIG_SETMASK, &old, nullptr), 0);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(::getpgid(child->pid()), child->pid());
  EXPECT_NE(::getpgid(child->pid()), ::getpgid(0));
  EXPECT_TRUE(child->Terminate(absl::Seconds(10)).ok());
  ASSERT_TRUE(WIFSIGNALED(*child->ExitStatus()));
  EXPECT_EQ(WTERMSIG(*child->ExitStatus()), SIGTERM);  // not blocked, so no SIGKILL needed
}

TEST_F(ProcessTest, ChildDiesWhenItsParentDies) {
  // An intermediate process spawns the child and exits: PR_SET_PDEATHSIG must
  // deliver SIGTERM to the orphan (as when the CLI is SIGKILLed).
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t middle = ::fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    ::close(fds[0]);
    absl::StatusOr<std::unique_ptr<Child>> child =
        Child::Spawn({"/bin/sh", "-c", "exec sleep 100"}, P("orphan.log"));
    pid_t pid = child.ok() ? (*child)->pid() : -1;
    [[maybe_unused]] ssize_t n = ::write(fds[1], &pid, sizeof(pid));
    ::_exit(0);  // no destructors: the Child is not terminated by us
  }
  ::close(fds[1]);
  pid_t orphan = -1;
  ASSERT_EQ(::read(fds[0], &orphan, sizeof(orphan)), static_cast<ssize_t>(sizeof(orphan)));
  ::close(fds[0]);
  int status;
  ASSERT_EQ(::waitpid(middle, &status, 0), middle);
  ASSERT_GT(orphan, 0);
  EXPECT_TRUE(GoneWithin(orphan, absl::Seconds(10)));
}

TEST_F(ProcessTest, LogCapturesStdoutAndStderr) {
  auto child = Sh("echo to-stdout; echo to-stderr >&2; exit 0");
  ASSERT_NE(child, nullptr);
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (child->IsRunning() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_FALSE(child->IsRunning());
  EXPECT_EQ(child->DescribeExit(), "exited with code 0");
  const std::string log = Slurp(child->log_path());
  EXPECT_NE(log.find("to-stdout"), std::string::npos) << log;
  EXPECT_NE(log.find("to-stderr"), std::string::npos) << log;
}

TEST_F(ProcessTest, SpawningAMissingProgramFailsAndLeavesNothing) {
  absl::StatusOr<std::unique_ptr<Child>> child =
      Child::Spawn({P("no-such-program")}, P("missing.log"));
  ASSERT_FALSE(child.ok());
  EXPECT_NE(child.status().message().find("No such file"), std::string::npos) << child.status();
  EXPECT_FALSE(Child::Spawn({}, P("x.log")).ok());
  EXPECT_FALSE(Child::Spawn({"/bin/true"}, P("no-such-dir/x.log")).ok());
}

TEST_F(ProcessTest, TerminateAllStopsEveryChildAndNamesTheStubbornOnes) {
  auto polite = Sh("exec sleep 100", "polite.log");
  auto stubborn =
      Sh(absl::StrCat("trap '' TERM; echo ready > ", P("ready"), "; while :; do sleep 1; done"),
         "stubborn.log");
  ASSERT_NE(polite, nullptr);
  ASSERT_NE(stubborn, nullptr);
  ASSERT_FALSE(WaitForText(dir_ / "ready", absl::Seconds(10)).empty());
  std::vector<Child*> killed =
      TerminateAll({polite.get(), stubborn.get()}, absl::Milliseconds(300));
  ASSERT_EQ(killed.size(), 1u);
  EXPECT_EQ(killed[0], stubborn.get());
  EXPECT_FALSE(polite->IsRunning());
  EXPECT_FALSE(stubborn->IsRunning());
}

TEST_F(ProcessTest, DestructorKillsARunningChild) {
  pid_t pid;
  {
    auto child = Sh("exec sleep 100");
    ASSERT_NE(child, nullptr);
    pid = child->pid();
  }
  errno = 0;
  EXPECT_EQ(::kill(pid, 0), -1);  // reaped, so the pid no longer exists
  EXPECT_EQ(errno, ESRCH);
}

TEST(WaitStatus, Describes) {
  EXPECT_EQ(DescribeWaitStatus(W_EXITCODE(3, 0)), "exited with code 3");
  EXPECT_NE(DescribeWaitStatus(W_EXITCODE(0, SIGKILL)).find("killed by signal 9"),
            std::string::npos);
  EXPECT_NE(DescribeWaitStatus(W_EXITCODE(0, SIGSEGV)).find("Segmentation fault"),
            std::string::npos);
}

TEST_F(ProcessTest, TailFileKeepsTheLastLines) {
  std::ofstream(P("log")) << "one\ntwo\nthree\nfour\n";
  EXPECT_EQ(TailFile(P("log"), 2), "three\nfour");
  EXPECT_EQ(TailFile(P("log"), 10), "one\ntwo\nthree\nfour");
  EXPECT_EQ(TailFile(P("missing"), 3), "");
}

TEST_F(ProcessTest, FindExecutablePrefersTheGivenDirectoryThenPath) {
  fs::create_directories(dir_ / "next_to");
  fs::create_directories(dir_ / "on_path");
  for (const char* d : {"next_to", "on_path"}) {
    const fs::path p = dir_ / d / "tool";
    std::ofstream(p) << "#!/bin/sh\n";
    fs::permissions(p, fs::perms::owner_all);
  }
  std::ofstream(dir_ / "on_path" / "plain") << "not executable";
  const char* old_path = std::getenv("PATH");
  const std::string saved = old_path ? old_path : "";
  ::setenv("PATH", (dir_ / "on_path").c_str(), 1);
  absl::StatusOr<std::string> a = FindExecutable("tool", (dir_ / "next_to").string());
  absl::StatusOr<std::string> b = FindExecutable("tool", (dir_ / "elsewhere").string());
  absl::StatusOr<std::string> c = FindExecutable("plain", "");
  absl::StatusOr<std::string> d = FindExecutable("nothing", (dir_ / "next_to").string());
  ::setenv("PATH", saved.c_str(), 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (dir_ / "next_to" / "tool").string());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, (dir_ / "on_path" / "tool").string());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(SelfExecutableDir().empty());
}

}  // namespace
}  // namespace stagewise::cli

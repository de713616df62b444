// The code interpreter's sandbox (worker/agent/sandbox.h) with real processes and the host's
// Python: code that loops forever, allocates 10 GB, writes 1 GB of output or files, opens
// sockets, forks a thousand processes or reads files outside its scratch directory is stopped
// or refused within the limits, and gets a result rather than harming the caller; a thousand
// calls leave no process, file, thread or memory behind.
#include "worker/agent/sandbox.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/util/text.h"
#include "tests/support/subprocess.h"
#include "worker/agent/sandbox_child.h"

namespace rlhfd::agent {
namespace {

using rlhfd::testing::TempDir;

SandboxOptions Options() {
  SandboxOptions options;
  options.launcher = RLHFD_SANDBOX_BIN;
  options.limits.wall_time = absl::Seconds(5);
  options.limits.cpu_seconds = 2;
  options.limits.memory_mb = 512;
  options.limits.processes = 16;
  options.limits.scratch_mb = 8;
  options.limits.file_mb = 4;
  options.limits.output_bytes = 4096;
  return options;
}

std::unique_ptr<Sandbox> Make(SandboxOptions options = Options()) {
  absl::StatusOr<std::unique_ptr<Sandbox>> made = Sandbox::Create(std::move(options));
  INFO(made.status());
  REQUIRE(made.ok());
  return *std::move(made);
}

SandboxResult Run(Sandbox& sandbox, const std::string& code) {
  absl::StatusOr<SandboxResult> result = sandbox.Run(code);
  INFO(result.status());
  REQUIRE(result.ok());
  INFO("stdout: " << result->stdout_text << "\nstderr: " << result->stderr_text);
  return *result;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

int ParentPid(int pid) {
  for (absl::string_view line :
       absl::StrSplit(ReadFile(absl::StrCat("/proc/", pid, "/status")), '\n')) {
    if (!absl::ConsumePrefix(&line, "PPid:")) continue;
    int parent = 0;
    return absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &parent) ? parent : 0;
  }
  return 0;
}

// Whether `pid` is this test process's descendant: other tests run sandboxes at the same time.
bool DescendsFromSelf(int pid) {
  const int self = ::getpid();
  for (int hops = 0; pid > 1 && hops < 64; ++hops) {
    pid = ParentPid(pid);
    if (pid == self) return true;
  }
  return false;
}

// This process's host processes inside a sandbox's namespaces: argv names rlhfd-sandbox.
// `children_only`: those the code started, i.e. neither a namespace's first process (1) nor its
// Python (2).
int SandboxProcesses(bool children_only) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    if (!DescendsFromSelf(pid)) continue;
    std::string cmdline = ReadFile(entry.path().string() + "/cmdline");
    if (!absl::StrContains(cmdline, std::string("rlhfd-sandbox\0", 14))) continue;
    if (!children_only) {
      ++count;
      continue;
    }
    for (absl::string_view line :
         absl::StrSplit(ReadFile(entry.path().string() + "/status"), '\n')) {
      if (!absl::ConsumePrefix(&line, "NSpid:")) continue;
      const std::vector<absl::string_view> ids = absl::StrSplit(line, '\t', absl::SkipEmpty());
      int inside = 0;
      if (!ids.empty() && absl::SimpleAtoi(ids.back(), &inside) && inside > 2) ++count;
    }
  }
  return count;
}

// A field of /proc/<process>/status (kB figures in kB); -1 when it is not there.
int64_t StatusField(const std::string& name, const std::string& process = "self") {
  for (absl::string_view line :
       absl::StrSplit(ReadFile(absl::StrCat("/proc/", process, "/status")), '\n')) {
    if (!absl::ConsumePrefix(&line, name + ":")) continue;
    int64_t value = 0;
    (void)absl::SimpleAtoi(
        absl::StripAsciiWhitespace(absl::StripSuffix(absl::StripAsciiWhitespace(line), "kB")),
        &value);
    return value;
  }
  return -1;
}

// The processes in sandboxes (a PID namespace below this one's) that descend from this process:
// (pid here, pid inside).
std::vector<std::pair<int, int>> SandboxedProcesses() {
  std::vector<std::pair<int, int>> processes;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid) || !DescendsFromSelf(pid)) {
      continue;
    }
    for (absl::string_view line :
         absl::StrSplit(ReadFile(entry.path().string() + "/status"), '\n')) {
      if (!absl::ConsumePrefix(&line, "NSpid:")) continue;
      const std::vector<absl::string_view> ids = absl::StrSplit(line, '\t', absl::SkipEmpty());
      int inside = 0;
      if (ids.size() > 1 && absl::SimpleAtoi(ids.back(), &inside)) {
        processes.emplace_back(pid, inside);
      }
    }
  }
  return processes;
}

// The pids of the sandboxes' first processes (PID 1 inside) that descend from this process.
std::vector<int> FirstProcessPids() {
  std::vector<int> pids;
  for (const auto& [pid, inside] : SandboxedProcesses()) {
    if (inside == 1) pids.push_back(pid);
  }
  return pids;
}

// The fields of /proc/<pid>/stat after the command name (which may hold spaces): state, parent,
// ...; empty when there is no such process.
std::vector<std::string> StatFields(int pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t end = stat.rfind(')');
  if (end == std::string::npos || end + 2 >= stat.size()) return {};
  return absl::StrSplit(stat.substr(end + 2), ' ');
}

// This process's children that have ended and not been waited for.
int ZombieChildren() {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    const std::vector<std::string> fields = StatFields(pid);
    if (fields.size() > 1 && fields[0] == "Z" && fields[1] == std::to_string(::getpid())) ++count;
  }
  return count;
}

std::vector<std::string> SandboxRoots() {
  std::vector<std::string> roots;
  const char* temp = std::getenv("TMPDIR");
  for (const auto& entry :
       std::filesystem::directory_iterator(temp != nullptr && *temp ? temp : "/tmp")) {
    if (absl::StartsWith(entry.path().filename().string(), "rlhfd-sandbox-")) {
      roots.push_back(entry.path());
    }
  }
  std::sort(roots.begin(), roots.end());
  return roots;
}

TEST_CASE("code runs and its output and exceptions come back", "[sandbox]") {
  auto sandbox = Make();
  const SandboxResult printed =
      Run(*sandbox, "print(6 * 7)\nimport sys\nprint('e', file=sys.stderr)");
  CHECK(printed.exit_code == 0);
  CHECK(printed.stdout_text == "42\n");
  CHECK(printed.stderr_text == "e\n");
  CHECK_FALSE(printed.timed_out);
  CHECK_FALSE(printed.output_truncated);

  const SandboxResult raised = Run(*sandbox, "x = 1\n1 / 0\n");
  CHECK(raised.exit_code == 1);
  CHECK(absl::StrContains(raised.stderr_text, "ZeroDivisionError"));
  CHECK(absl::StrContains(raised.stderr_text, "File \"<tool>\", line 2"));
  CHECK_FALSE(absl::StrContains(raised.stderr_text, "<string>"));  // the runner's own frame

  const SandboxResult syntax = Run(*sandbox, "def (:\n");
  CHECK(syntax.exit_code == 1);
  CHECK(absl::StrContains(syntax.stderr_text, "SyntaxError"));

  // The scratch directory is the working directory, writable, and new for each call.
  const SandboxResult wrote =
      Run(*sandbox,
          "import os\nopen('a.txt', 'w').write('hi')\nprint(os.getcwd(), open('a.txt').read())");
  CHECK(wrote.stdout_text == "/work hi\n");
  CHECK(Run(*sandbox, "import os\nprint(os.listdir('.'))").stdout_text == "[]\n");
}

TEST_CASE("a loop forever is stopped at the CPU limit, a sleep at the deadline", "[sandbox]") {
  SandboxOptions options = Options();
  options.limits.cpu_seconds = 1;
  options.limits.wall_time = absl::Seconds(30);  // a loaded machine's second of CPU takes longer
  auto sandbox = Make(options);
  const SandboxResult spun = Run(*sandbox, "while True:\n    pass\n");
  INFO("exit " << spun.exit_code << " signal " << spun.signal << " timed out " << spun.timed_out);
  CHECK(spun.signal == SIGXCPU);
  CHECK_FALSE(spun.timed_out);
  CHECK(spun.cpu_time >= absl::Milliseconds(900));  // the kernel counts in ticks
  // Sleeping takes no CPU: the deadline stops it.
  options.limits.wall_time = absl::Seconds(2);
  sandbox = Make(options);
  const SandboxResult slept = Run(*sandbox, "import time\ntime.sleep(60)\n");
  CHECK(slept.timed_out);
  CHECK(slept.signal == SIGKILL);
  CHECK(slept.wall_time < absl::Seconds(5));
}

TEST_CASE("10 GB of memory is refused", "[sandbox]") {
  auto sandbox = Make();
  const SandboxResult result = Run(*sandbox, "x = bytearray(10 * 1024 ** 3)\n");
  CHECK(result.exit_code == 1);
  CHECK(absl::StrContains(result.stderr_text, "MemoryError"));
}

TEST_CASE("1 GB of output is cut at the cap and its writer stopped", "[sandbox]") {
  auto sandbox = Make();
  const SandboxResult result =
      Run(*sandbox,
          "import sys\nchunk = 'x' * 65536\nfor _ in range(16384):\n    sys.stdout.write(chunk)\n");
  CHECK(result.output_truncated);
  CHECK(result.signal == SIGKILL);
  CHECK(result.stdout_text.size() + result.stderr_text.size() == 4096);
  CHECK(result.wall_time < absl::Seconds(5));
  // The cut falls where a character starts: 'a' and 2,047 two-byte characters, not the first
  // byte of the 2,048th.
  const SandboxResult two_byte = Run(*sandbox, "import sys\nsys.stdout.write('a' + 'é' * 4096)\n");
  CHECK(two_byte.output_truncated);
  CHECK(two_byte.stdout_text.size() == 4095);
  CHECK(IsValidUtf8(two_byte.stdout_text));
  // Bytes that are not UTF-8 are cut at the count, not backed over.
  const SandboxResult binary =
      Run(*sandbox, "import sys\nsys.stdout.buffer.write(b'\\x80' * 8192)\n");
  CHECK(binary.output_truncated);
  CHECK(binary.stdout_text == std::string(4096, '\x80'));
  // A file larger than file_mb, and a scratch directory filled past scratch_mb, are refused.
  const SandboxResult big_file = Run(*sandbox,
                                     "try:\n    open('f', 'wb').write(b'x' * (5 << 20))\nexcept "
                                     "OSError as e:\n    print('refused', e.errno)\n");
  CHECK(absl::StartsWith(big_file.stdout_text, "refused 27"));  // EFBIG
  const SandboxResult full =
      Run(*sandbox,
          "try:\n    for i in range(4):\n        open(f'f{i}', 'wb').write(b'x' * (3 << 20))\n"
          "except OSError as e:\n    print('refused', e.errno)\n");
  CHECK(absl::StartsWith(full.stdout_text, "refused 28"));  // ENOSPC
}

TEST_CASE("no network: neither the host's loopback nor the outside", "[sandbox]") {
  // A listener of this process on 127.0.0.1: the code must not reach it.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  REQUIRE(listener >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  socklen_t length = sizeof(address);
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  const int port = ntohs(address.sin_port);

  auto sandbox = Make();
  const SandboxResult result =
      Run(*sandbox, absl::StrCat("import socket\n"
                                 "for host, port in (('127.0.0.1', ",
                                 port,
                                 "), ('8.8.8.8', 53), ('1.1.1.1', 443)):\n"
                                 "    try:\n"
                                 "        socket.create_connection((host, port), timeout=2)\n"
                                 "        print('connected', host)\n"
                                 "    except OSError as e:\n"
                                 "        print('refused', host, e.errno)\n"
                                 "print(sorted(n for _, n in socket.if_nameindex()))\n"));
  CHECK(result.exit_code == 0);
  CHECK_FALSE(absl::StrContains(result.stdout_text, "connected"));
  CHECK(absl::StrContains(result.stdout_text, "refused 127.0.0.1"));
  CHECK(absl::StrContains(result.stdout_text, "refused 8.8.8.8"));
  CHECK(absl::StrContains(result.stdout_text, "['lo']"));
  CHECK(::accept(listener, nullptr, nullptr) < 0);  // nobody came
  ::close(listener);
}

TEST_CASE("a thousand forks are refused past the process limit, and none outlives the call",
          "[sandbox]") {
  auto sandbox = Make();
  const SandboxResult result = Run(*sandbox,
                                   "import os, time\n"
                                   "started = 0\n"
                                   "try:\n"
                                   "    for _ in range(1000):\n"
                                   "        if os.fork() == 0:\n"
                                   "            time.sleep(600)\n"
                                   "            os._exit(0)\n"
                                   "        started += 1\n"
                                   "except OSError as e:\n"
                                   "    print('refused after', started, e.errno)\n");
  CHECK(result.exit_code == 0);
  INFO(result.stdout_text);
  // 16 processes of the sandbox's id: its first, Python and 14 forks; then EAGAIN.
  CHECK(absl::StartsWith(result.stdout_text, "refused after 14 11"));
  CHECK(SandboxProcesses(/*children_only=*/true) == 0);
}

// An orphan (a double fork's grandchild) becomes the first process's child when its parent
// ends; the first process waits for it as it ends, so orphans do not pile up as zombies that
// RLIMIT_NPROC counts (16 here: 40 double forks in a row would be refused from the 15th).
TEST_CASE("orphans the code leaves are waited for as they end", "[sandbox]") {
  auto sandbox = Make();
  const SandboxResult result = Run(*sandbox,
                                   "import os, time\n"
                                   "def double_fork():\n"
                                   "    child = os.fork()\n"
                                   "    if child == 0:\n"
                                   "        try:\n"
                                   "            if os.fork() == 0:\n"
                                   "                os._exit(0)\n"
                                   "            os._exit(0)\n"
                                   "        except OSError:\n"
                                   "            os._exit(1)\n"
                                   "    return os.waitpid(child, 0)[1] == 0\n"
                                   "made, deadline = 0, time.time() + 4\n"
                                   "while made < 40 and time.time() < deadline:\n"
                                   "    try:\n"
                                   "        if double_fork():\n"
                                   "            made += 1\n"
                                   "            continue\n"
                                   "    except OSError:\n"
                                   "        pass\n"
                                   "    time.sleep(0.02)\n"
                                   "print(made)\n");
  CHECK(result.stdout_text == "40\n");
}

TEST_CASE("files outside the scratch directory are not there to read or write", "[sandbox]") {
  TempDir secret_dir;
  const std::string secret = secret_dir.path() + "/secret.txt";
  std::ofstream(secret) << "the worker's secret";
  auto sandbox = Make();
  const SandboxResult result =
      Run(*sandbox, absl::StrCat("import os\n"
                                 "for path in ('",
                                 secret,
                                 "', '/etc/passwd', '/etc/hostname', '/proc/1/environ', "
                                 "'/root/.bashrc'):\n"
                                 "    try:\n"
                                 "        open(path).read()\n"
                                 "        print('read', path)\n"
                                 "    except OSError as e:\n"
                                 "        print('refused', e.errno)\n"
                                 "for path in ('/usr/evil', '/evil', '/dev/evil'):\n"
                                 "    try:\n"
                                 "        open(path, 'w')\n"
                                 "        print('wrote', path)\n"
                                 "    except OSError as e:\n"
                                 "        print('refused', e.errno)\n"
                                 "print(sorted(os.listdir('/')))\n"
                                 "print(os.getuid(), os.getpid())\n"));
  CHECK(result.exit_code == 0);
  CHECK_FALSE(absl::StrContains(result.stdout_text, "read "));
  CHECK_FALSE(absl::StrContains(result.stdout_text, "wrote "));
  // The root holds the runtime, /dev, /tmp (a link to /work) and /work: nothing of the host's.
  CHECK(absl::StrContains(result.stdout_text, "'dev', "));
  CHECK(absl::StrContains(result.stdout_text, "'tmp', 'usr', 'work']"));
  CHECK_FALSE(absl::StrContains(result.stdout_text, "'etc'"));
  CHECK_FALSE(absl::StrContains(result.stdout_text, "'proc'"));
  CHECK_FALSE(absl::StrContains(result.stdout_text, "'root'"));
  CHECK(absl::StrContains(result.stdout_text, "65534 2\n"));  // nobody, after its first process
}

TEST_CASE("a read-only path stays read-only below, mounts under it included", "[sandbox]") {
  // A writable tmpfs mounted under a read-only path: a bind remounted read-only at its top
  // would leave it writable. Mounting needs root; elsewhere the case is reported and left.
  if (::geteuid() != 0) {
    WARN("not root: cannot mount the tmpfs this case needs; not run");
    return;
  }
  char dir_template[] = "/var/tmp/rlhfd-readonly-XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  const std::string sub = dir + "/sub";
  // Writable by anyone, so that only the read-only mount can refuse (EROFS, not EACCES).
  REQUIRE(::chmod(dir.c_str(), 0777) == 0);
  REQUIRE(::mkdir(sub.c_str(), 0777) == 0);
  REQUIRE(::mount("tmpfs", sub.c_str(), "tmpfs", 0, "size=1m,mode=0777") == 0);
  {
    SandboxOptions options = Options();
    options.read_only_paths = {dir};
    auto sandbox = Make(options);
    const SandboxResult result = Run(*sandbox, absl::StrCat("for path in ('", dir, "/top', '", sub,
                                                            "/below'):\n"
                                                            "    try:\n"
                                                            "        open(path, 'w')\n"
                                                            "        print('wrote', path)\n"
                                                            "    except OSError as e:\n"
                                                            "        print('refused', e.errno)\n"));
    CHECK(result.stdout_text == "refused 30\nrefused 30\n");  // EROFS, both
  }
  CHECK_FALSE(std::filesystem::exists(sub + "/below"));
  ::umount2(sub.c_str(), MNT_DETACH);
  std::filesystem::remove_all(dir);
}

// Points $TMPDIR at a directory of this test's own while alive, so that the roots it counts are
// its sandboxes' and not those of tests running beside it.
class PrivateTmpdir {
 public:
  PrivateTmpdir() {
    const char* previous = std::getenv("TMPDIR");
    if (previous != nullptr) previous_ = previous;
    ::setenv("TMPDIR", dir_.path().c_str(), 1);
  }
  ~PrivateTmpdir() {
    if (previous_.has_value()) {
      ::setenv("TMPDIR", previous_->c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
  }
  const std::string& path() const { return dir_.path(); }

 private:
  TempDir dir_;
  std::optional<std::string> previous_;
};

TEST_CASE("a root worker's TMPDIR or read-only path that nobody can reach is refused",
          "[sandbox]") {
  if (::geteuid() != 0) {
    WARN("not root: the sandbox runs as this user, whose own directories it reaches; not run");
    return;
  }
  PrivateTmpdir private_tmpdir;  // mkdtemp's 0700: the sandbox's user, nobody, cannot search it
  absl::StatusOr<std::unique_ptr<Sandbox>> made = Sandbox::Create(Options());
  CHECK(made.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(made.status().message(), "TMPDIR '" + private_tmpdir.path()));
  CHECK(absl::StrContains(made.status().message(), "chmod o+x"));
  ::chmod(private_tmpdir.path().c_str(), 0711);
  // Outside /tmp, which the sandbox makes its own.
  char hidden_template[] = "/var/tmp/rlhfd-hidden-XXXXXX";
  REQUIRE(::mkdtemp(hidden_template) != nullptr);
  const std::string hidden_dir = hidden_template;
  SandboxOptions hidden = Options();
  hidden.read_only_paths = {hidden_dir};
  made = Sandbox::Create(hidden);
  CHECK(absl::StrContains(made.status().message(), "read_only_paths entry '" + hidden_dir));
  ::chmod(hidden_dir.c_str(), 0755);
  {
    auto sandbox = Make(hidden);
    CHECK(Run(*sandbox, "import os\nprint(os.listdir('" + hidden_dir + "'))").stdout_text ==
          "[]\n");
  }
  ::rmdir(hidden_dir.c_str());
}

// A sandbox refused for want of a descriptor for its plan's memfd says so and leaves no scratch
// root in TMPDIR (it left one: the root was removed only once the plan was held). The soft
// descriptor limit is lowered to the launcher's descriptors, so that the memfd cannot be moved
// above them, and put back before anything else runs.
TEST_CASE("a sandbox refused for want of a descriptor leaves no scratch root", "[sandbox]") {
  PrivateTmpdir tmpdir;
  ::chmod(tmpdir.path().c_str(), 0711);  // A root worker's sandbox (nobody) must reach it.
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  rlimit few = saved;
  few.rlim_cur = kFirstFreeFd;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &few) == 0);
  absl::StatusOr<std::unique_ptr<Sandbox>> made = Sandbox::Create(Options());
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  INFO(made.status());
  CHECK(made.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(made.status().message(), "cannot hold the plan in a memfd"));
  CHECK(std::filesystem::is_empty(tmpdir.path()));
}

TEST_CASE("the plan survives its encoding, and damaged bytes are refused", "[sandbox]") {
  SandboxPlan plan;
  plan.root = "/tmp/rlhfd-sandbox-x";
  plan.entries = {
      {.kind = SandboxPlan::kSymlink, .source = "usr/bin", .target = "/r/bin", .inside = "/bin"},
      {.kind = SandboxPlan::kTmpfs, .source = "size=8m", .target = "/r/work", .inside = "/work"}};
  plan.argv = {"/usr/bin/python3", "-c", std::string("print(1)\n\0:9:", 14), ""};
  plan.env = {"HOME=/work"};
  plan.limits = {{RLIMIT_CPU, 2}, {RLIMIT_AS, rlim_t{512} << 20}};
  const std::string bytes = EncodeSandboxPlan(plan);
  const std::optional<SandboxPlan> back = DecodeSandboxPlan(bytes);
  REQUIRE(back.has_value());
  CHECK(back->root == plan.root);
  REQUIRE(back->entries.size() == 2);
  CHECK(back->entries[1].kind == SandboxPlan::kTmpfs);
  CHECK(back->entries[1].source == "size=8m");
  CHECK(back->entries[0].inside == "/bin");
  CHECK(back->argv == plan.argv);
  CHECK(back->env == plan.env);
  CHECK(back->limits == plan.limits);
  // Every cut, a byte more, a huge count and a kind or resource out of range.
  for (size_t size = 0; size < bytes.size(); ++size) {
    CHECK_FALSE(DecodeSandboxPlan(bytes.substr(0, size)).has_value());
  }
  CHECK_FALSE(DecodeSandboxPlan(bytes + "0").has_value());
  CHECK_FALSE(DecodeSandboxPlan(bytes.substr(1)).has_value());  // not the magic
  const std::string magic = bytes.substr(0, bytes.find(':') + 1);
  // A count past 2^64, and an empty number, are not 0.
  CHECK_FALSE(DecodeSandboxPlan(magic + "2:/r99999999999999999999:1:3:/py0:0:").has_value());
  CHECK_FALSE(DecodeSandboxPlan(magic + "2:/r0:1:3:/py0::").has_value());
  CHECK(DecodeSandboxPlan(magic + "2:/r0:1:3:/py0:0:").has_value());
  SandboxPlan bad_kind = plan;
  bad_kind.entries[0].kind = static_cast<SandboxPlan::Kind>(9);
  CHECK_FALSE(DecodeSandboxPlan(EncodeSandboxPlan(bad_kind)).has_value());
  SandboxPlan bad_limit = plan;
  bad_limit.limits.emplace_back(RLIM_NLIMITS, 1);
  CHECK_FALSE(DecodeSandboxPlan(EncodeSandboxPlan(bad_limit)).has_value());
}

// Each sandbox process is started by rlhfd-sandbox, not cloned from the caller: a clone would
// copy the caller's mappings (a GPU worker's many GB) into every call, at ~40 ms a GB.
TEST_CASE("the sandbox's first process holds none of the caller's memory", "[sandbox]") {
  // 1 GiB of the caller's address space, untouched, before the sandbox starts its processes.
  constexpr size_t kBallast = size_t{1} << 30;
  void* ballast =
      ::mmap(nullptr, kBallast, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(ballast != MAP_FAILED);
  absl::Cleanup unmap = [&] { ::munmap(ballast, kBallast); };
  auto sandbox = Make();  // its warm processes wait for code
  const std::vector<int> firsts = FirstProcessPids();
  REQUIRE(!firsts.empty());
  const int64_t first_size_kb = StatusField("VmSize", std::to_string(firsts[0]));
  INFO("caller " << StatusField("VmSize") << " kB, first process " << first_size_kb << " kB");
  REQUIRE(first_size_kb > 0);
  CHECK(first_size_kb < 64 * 1024);
  CHECK(StatusField("VmSize") > 1024 * 1024);
  CHECK(Run(*sandbox, "print(6 * 7)").stdout_text == "42\n");
}

// RLIMIT_AS bounds each process of a sandbox, not their sum: where memory runs short, the
// kernel's OOM killer must take the sandbox's processes before the worker.
TEST_CASE("the OOM killer takes a sandbox's processes before the worker", "[sandbox]") {
  auto sandbox = Make();  // its warm processes: the first ones and their Pythons
  const auto processes = SandboxedProcesses();
  CHECK(processes.size() >= 2);
  for (const auto& [pid, inside] : processes) {
    INFO("pid " << pid << " (" << inside << " inside)");
    CHECK(absl::StripAsciiWhitespace(ReadFile(absl::StrCat("/proc/", pid, "/oom_score_adj"))) ==
          "1000");
  }
  // The code has no /proc to lower it through, and the caller keeps its own.
  CHECK(
      Run(*sandbox, "import os\nprint(os.path.exists('/proc/self/oom_score_adj'))\n").stdout_text ==
      "False\n");
  CHECK(absl::StripAsciiWhitespace(ReadFile("/proc/self/oom_score_adj")) != "1000");
}

// kill(0, ...) signals the caller's process group, whatever its PID namespace: each sandbox is
// a session of its own, so the code reaches only its own sandbox's processes, not the worker
// (a worker that is not root runs its sandboxes as its own user) nor other sandboxes.
TEST_CASE("the code's kill(0) and killpg reach its own sandbox only", "[sandbox]") {
  auto other = Make();
  const std::vector<int> others = FirstProcessPids();  // `other`'s warm processes
  REQUIRE(!others.empty());
  auto sandbox = Make();
  for (const char* code : {"import os, signal\nos.kill(0, signal.SIGKILL)",
                           "import os, signal\nos.killpg(os.getpgrp(), signal.SIGTERM)"}) {
    const absl::StatusOr<SandboxResult> result = sandbox->Run(code);
    REQUIRE(result.ok());
    INFO(code);
    for (const int pid : others) {
      const std::vector<std::string> fields = StatFields(pid);
      INFO("pid " << pid << ": " << absl::StrJoin(fields, " "));
      REQUIRE(!fields.empty());
      CHECK((fields[0] == "S" || fields[0] == "R"));  // alive: not killed, stopped or a zombie
    }
  }
  CHECK(Run(*other, "print(1)").stdout_text == "1\n");
}

// The caller's descriptors reach neither the first process nor Python, close-on-exec or not.
TEST_CASE("no descriptor of the caller reaches the sandbox", "[sandbox]") {
  TempDir dir;
  const std::string marker = dir.path() + "/leak-marker";
  const int leaked = ::open(marker.c_str(), O_WRONLY | O_CREAT, 0600);  // no O_CLOEXEC
  REQUIRE(leaked >= 0);
  absl::Cleanup close_leaked = [&] { ::close(leaked); };
  auto sandbox = Make();
  for (const int pid : FirstProcessPids()) {
    std::error_code error;
    for (const auto& fd :
         std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"), error)) {
      CHECK(std::filesystem::read_symlink(fd.path(), error).string() != marker);
    }
  }
  const SandboxResult result = Run(*sandbox,
                                   "import os\n"
                                   "held = []\n"
                                   "for fd in range(3, 1024):\n"
                                   "    try:\n"
                                   "        os.fstat(fd)\n"
                                   "        held.append(fd)\n"
                                   "    except OSError:\n"
                                   "        pass\n"
                                   "print(held)\n");
  CHECK(result.stdout_text == "[]\n");
}

TEST_CASE("a launcher that cannot start a sandbox is an error naming it, and leaves no zombie",
          "[sandbox]") {
  TempDir dir;
  const std::string not_a_program = dir.path() + "/rlhfd-sandbox";
  std::ofstream(not_a_program) << "not an executable\n";
  ::chmod(not_a_program.c_str(), 0755);
  for (const std::string& launcher : {std::string("/bin/true"), not_a_program}) {
    SandboxOptions options = Options();
    options.launcher = launcher;
    const absl::StatusOr<std::unique_ptr<Sandbox>> made = Sandbox::Create(options);
    INFO(made.status());
    CHECK(made.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(made.status().message(), launcher));
    CHECK(ZombieChildren() == 0);
  }
}

// A launcher gone after its clone, before handing the first process over (the OOM killer takes
// it first: its score is 1000), or one that fails at the id maps, leaves that process the
// caller's child, whose id the caller never learnt. This stand-in clones as rlhfd-sandbox does
// (CLONE_PARENT) and exits without a report; its "first process" lives on for a fifth of a second.
TEST_CASE("a launcher gone after its clone leaves no zombie of its first process", "[sandbox]") {
  TempDir dir;
  const std::string launcher = dir.path() + "/rlhfd-sandbox";
  std::ofstream(launcher) << "#!/usr/bin/python3\n"
                             "import ctypes, os, time\n"
                             "libc = ctypes.CDLL(None, use_errno=True)\n"
                             "clone = {'x86_64': 56, 'aarch64': 220}[os.uname().machine]\n"
                             "CLONE_PARENT, SIGCHLD = 0x8000, 17\n"
                             "if libc.syscall(clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0) == 0:\n"
                             "    os.closerange(3, 64)\n"
                             "    time.sleep(0.2)\n"
                             "    os._exit(0)\n"
                             "os._exit(3)\n";
  ::chmod(launcher.c_str(), 0755);
  SandboxOptions options = Options();
  options.launcher = launcher;
  const absl::StatusOr<std::unique_ptr<Sandbox>> made = Sandbox::Create(options);
  INFO(made.status());
  CHECK(absl::StrContains(made.status().message(), "ended without starting a sandbox (exit 3"));
  absl::SleepFor(absl::Seconds(1));  // the stand-in's first process has ended by now
  CHECK(ZombieChildren() == 0);
}

// The system-call filter: what the code has no use for, and what widens the kernel's attack
// surface, is refused; what Python itself needs (threads, fork, subprocesses) still works.
TEST_CASE("the code can make no namespace nor trace nor reach io_uring or BPF or userfaultfd",
          "[sandbox]") {
#if !defined(__x86_64__)
  WARN("the calls are made by x86_64 numbers; not run on this architecture");
  return;
#endif
  auto sandbox = Make();
  const SandboxResult refused = Run(*sandbox,
                                    "import ctypes, os\n"
                                    "libc = ctypes.CDLL(None, use_errno=True)\n"
                                    "def errno_of(result):\n"
                                    "    return 0 if result >= 0 else ctypes.get_errno()\n"
                                    "calls = {\n"
                                    "  'unshare_user': lambda: libc.unshare(0x10000000),\n"
                                    "  'unshare_mount': lambda: libc.unshare(0x20000),\n"
                                    "  'clone_user': lambda: libc.syscall(56, 0x10000000 | 17,"
                                    " 0, 0, 0, 0),\n"
                                    "  'ptrace_traceme': lambda: libc.ptrace(0, 0, 0, 0),\n"
                                    "  'io_uring_setup': lambda: libc.syscall(425, 8, None),\n"
                                    "  'bpf': lambda: libc.syscall(321, 0, None, 0),\n"
                                    "  'userfaultfd': lambda: libc.syscall(323, 0),\n"
                                    "  'keyctl': lambda: libc.syscall(250, 0, 0, 0, 0, 0),\n"
                                    "}\n"
                                    "for name, call in calls.items():\n"
                                    "    print(name, errno_of(call()))\n");
  CHECK(refused.exit_code == 0);
  INFO(refused.stdout_text);
  for (const char* name : {"unshare_user", "unshare_mount", "clone_user", "ptrace_traceme",
                           "io_uring_setup", "bpf", "userfaultfd", "keyctl"}) {
    CHECK(absl::StrContains(refused.stdout_text, absl::StrCat(name, " 1\n")));  // EPERM
  }
  const SandboxResult allowed = Run(*sandbox,
                                    "import subprocess, sys, threading\n"
                                    "box = []\n"
                                    "worker = threading.Thread(target=lambda: box.append(6 * 7))\n"
                                    "worker.start(); worker.join()\n"
                                    "out = subprocess.run([sys.executable, '-c', 'print(1 + 1)'],"
                                    " capture_output=True, text=True).stdout\n"
                                    "print(box[0], out.strip())\n");
  CHECK(allowed.stdout_text == "42 2\n");
}

TEST_CASE("bad options are refused naming the field", "[sandbox]") {
  SandboxOptions missing = Options();
  missing.launcher = "/nonexistent/rlhfd-sandbox";
  absl::StatusOr<std::unique_ptr<Sandbox>> missing_made = Sandbox::Create(missing);
  CHECK(missing_made.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(missing_made.status().message(), "/nonexistent/rlhfd-sandbox"));
  SandboxOptions outside = Options();
  outside.python = "/opt/elsewhere/python3";
  absl::StatusOr<std::unique_ptr<Sandbox>> made = Sandbox::Create(outside);
  CHECK(made.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(made.status().message(), "python"));
  SandboxOptions negative = Options();
  negative.limits.memory_mb = 0;
  made = Sandbox::Create(negative);
  CHECK(made.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(made.status().message(), "memory_mb"));
  SandboxOptions relative = Options();
  relative.read_only_paths = {"venv"};
  made = Sandbox::Create(relative);
  CHECK(absl::StrContains(made.status().message(), "read_only_paths"));
  // The sandbox's own /tmp, /work and /dev, and the host's /proc, cannot be bound.
  for (const char* own : {"/tmp", "/tmp/venv", "/dev", "/proc/self"}) {
    SandboxOptions clash = Options();
    clash.read_only_paths = {own};
    made = Sandbox::Create(clash);
    CHECK(made.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(made.status().message(), "which the sandbox makes its own"));
  }
  auto sandbox = Make();
  CHECK(sandbox->Run(std::string(2 << 20, '#')).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a thousand calls, four threads at a time, leave nothing behind", "[sandbox][slow]") {
  const int64_t threads_before = StatusField("Threads");
  PrivateTmpdir private_tmpdir;
  ::chmod(private_tmpdir.path().c_str(), 0711);  // a root worker's sandbox user must reach it
  const std::vector<std::string> roots_before = SandboxRoots();
  {
    auto sandbox = Make();
    Run(*sandbox, "print(0)");  // the first call's allocations are not a leak
    const int64_t rss_before = StatusField("VmRSS");
    std::vector<std::thread> callers;
    std::atomic<int> good{0};
    std::mutex failures_mutex;
    std::vector<std::string> failures;
    for (int t = 0; t < 4; ++t) {
      callers.emplace_back([&, t] {
        for (int i = 0; i < 250; ++i) {
          absl::StatusOr<SandboxResult> result =
              sandbox->Run(absl::StrCat("print(", t, " * 1000 + ", i, ")"));
          if (result.ok() && result->exit_code == 0 &&
              result->stdout_text == absl::StrCat(t * 1000 + i, "\n")) {
            ++good;
          } else {
            std::lock_guard<std::mutex> lock(failures_mutex);
            failures.push_back(result.ok()
                                   ? absl::StrCat("exit ", result->exit_code, " signal ",
                                                  result->signal, " out '", result->stdout_text,
                                                  "' err '", result->stderr_text, "'")
                                   : result.status().ToString());
          }
        }
      });
    }
    for (std::thread& caller : callers) caller.join();
    INFO(absl::StrJoin(failures, "\n"));
    CHECK(good == 1000);
    CHECK(StatusField("VmRSS") - rss_before < 16 * 1024);  // kB
    CHECK(SandboxProcesses(/*children_only=*/true) == 0);
  }
  CHECK(SandboxProcesses(/*children_only=*/false) == 0);
  CHECK(SandboxRoots() == roots_before);  // each sandbox's root mount point is removed
  CHECK(StatusField("Threads") == threads_before);
}

}  // namespace
}  // namespace rlhfd::agent

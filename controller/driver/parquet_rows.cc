// ReadParquetRows: loads the Parquet reader plugin (librlhfd_parquet.so) once and calls it.
#include "controller/driver/parquet_rows.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/files.h"

namespace rlhfd::controller {
namespace {

using ReadFn = absl::Status (*)(const std::string&, const std::vector<std::string>&,
                                const ParquetReadLimits&, const ParquetRowVisitor&);
constexpr char kPluginFile[] = "librlhfd_parquet.so";
constexpr char kEntryPoint[] = "rlhfd_read_parquet_rows_v4";

std::string ExecutableDirectory() {
  char path[PATH_MAX] = {};
  const ssize_t length = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) return ".";
  const std::string executable(path, static_cast<size_t>(length));
  return executable.substr(0, executable.rfind('/'));
}

struct Plugin {
  ReadFn read = nullptr;
  std::string error;  // why there is none
};

Plugin LoadPlugin() {
  std::vector<std::string> candidates;
  if (const char* named = std::getenv("RLHFD_PARQUET_PLUGIN"); named != nullptr && *named) {
    candidates.push_back(named);
  } else {
    const std::string directory = ExecutableDirectory();
    candidates = {absl::StrCat(directory, "/", kPluginFile),
                  absl::StrCat(directory, "/../lib/", kPluginFile)};
  }
  std::vector<std::string> tried;
  for (const std::string& candidate : candidates) {
    if (!PathExists(candidate)) {
      tried.push_back(absl::StrCat(candidate, " (absent)"));
      continue;
    }
    // Never unloaded: the reader is used for the life of the process.
    void* handle = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      tried.push_back(absl::StrCat(candidate, " (", ::dlerror(), ")"));
      continue;
    }
    if (void* symbol = ::dlsym(handle, kEntryPoint); symbol != nullptr) {
      return {.read = reinterpret_cast<ReadFn>(symbol)};
    }
    tried.push_back(absl::StrCat(candidate, " (no ", kEntryPoint, ")"));
  }
  return {.error = absl::StrJoin(tried, ", ")};
}

}  // namespace

absl::Status ReadParquetRows(const std::string& file, const std::vector<std::string>& columns,
                             const ParquetReadLimits& limits, const ParquetRowVisitor& visit) {
  static std::once_flag once;
  static Plugin plugin;
  std::call_once(once, [] { plugin = LoadPlugin(); });
  if (plugin.read == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        file,
        " is Parquet, and this program (rlhfd-controller, or rlhfctl validate) has no Parquet "
        "reader: ",
        plugin.error,
        ". Build with -DRLHFD_WITH_PARQUET=ON (deploy/setup.sh installs pyarrow), bundle without "
        "RLHFD_BUNDLE_PARQUET=0, set RLHFD_PARQUET_PLUGIN, or give the data as JSONL "
        "(docs/data.md)"));
  }
  return plugin.read(file, columns, limits, visit);
}

}  // namespace rlhfd::controller

// Row-per-job store on SQLite, and the import of the older file-per-job store.
#include "controller/store/job_store.h"

#include <google/protobuf/type.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/type_resolver.h>
#include <google/protobuf/util/type_resolver_util.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"

namespace rlhfd::controller {
namespace {

constexpr char kJobPrefix[] = "job-";
constexpr char kCounter[] = "next_job_number";

// jobs: the current record of each job, a serialized v1::Job (binary: parsing 10,000 of them at
// start-up takes a fraction of a second, where their JSON took seconds). corrupt_jobs: records
// set aside because they did not parse, kept for a person to look at. counters: the next job
// number.
constexpr char kSchema[] =
    "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
    "CREATE TABLE IF NOT EXISTS jobs (number INTEGER PRIMARY KEY, record BLOB NOT NULL);"
    "CREATE TABLE IF NOT EXISTS corrupt_jobs (number INTEGER PRIMARY KEY, record BLOB, "
    "reason TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);";

// The job number a file name of the older store stands for ("job-12.json",
// "job-12.json.corrupt"); 0 for other names.
int64_t NumberOfFile(const std::string& name) {
  const size_t dot = name.find('.');
  int64_t number = 0;
  return ParseJobId(name.substr(0, dot), &number) ? number : 0;
}

// protobuf's JsonStringToMessage turns the descriptor of every message type a job holds into a
// google.protobuf.Type again on each call, about 1 ms per job; keeping them makes importing
// 10,000 job files take seconds rather than most of a minute. Used by one thread.
class CachingTypeResolver final : public google::protobuf::util::TypeResolver {
 public:
  static constexpr char kUrlPrefix[] = "type.googleapis.com";

  CachingTypeResolver()
      : resolver_(google::protobuf::util::NewTypeResolverForDescriptorPool(
            kUrlPrefix, google::protobuf::DescriptorPool::generated_pool())) {}

  google::protobuf::util::Status ResolveMessageType(const std::string& url,
                                                    google::protobuf::Type* type) override {
    return Resolve(url, type, messages_, [&](google::protobuf::Type* out) {
      return resolver_->ResolveMessageType(url, out);
    });
  }
  google::protobuf::util::Status ResolveEnumType(const std::string& url,
                                                 google::protobuf::Enum* type) override {
    return Resolve(url, type, enums_, [&](google::protobuf::Enum* out) {
      return resolver_->ResolveEnumType(url, out);
    });
  }

 private:
  template <typename Type, typename Lookup>
  static google::protobuf::util::Status Resolve(const std::string& url, Type* type,
                                                std::map<std::string, Type>& cache, Lookup lookup) {
    auto found = cache.find(url);
    if (found == cache.end()) {
      Type resolved;
      if (auto status = lookup(&resolved); !status.ok()) return status;
      found = cache.emplace(url, std::move(resolved)).first;
    }
    *type = found->second;
    return google::protobuf::util::Status();
  }

  std::unique_ptr<google::protobuf::util::TypeResolver> resolver_;
  std::map<std::string, google::protobuf::Type> messages_;
  std::map<std::string, google::protobuf::Enum> enums_;
};

void BindBlob(sqlite3_stmt* statement, int index, const std::string& bytes) {
  sqlite3_bind_blob(statement, index, bytes.data(), static_cast<int>(bytes.size()),
                    SQLITE_TRANSIENT);
}

}  // namespace

bool ParseJobId(const std::string& job_id, int64_t* number) {
  constexpr size_t prefix = sizeof(kJobPrefix) - 1;
  if (job_id.size() <= prefix || job_id.size() > prefix + 18 ||
      !absl::StartsWith(job_id, kJobPrefix)) {
    return false;
  }
  const absl::string_view digits = absl::string_view(job_id).substr(prefix);
  if (digits[0] == '0') return false;
  for (char c : digits) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return absl::SimpleAtoi(digits, number) && *number > 0;
}

std::string JobId(int64_t number) { return absl::StrCat(kJobPrefix, number); }

absl::StatusOr<JobStore> JobStore::Open(const std::string& state_dir) {
  const std::string path = state_dir + "/jobs.db";
  ASSIGN_OR_RETURN(sqlite::Database db, sqlite::OpenDatabase(path, "job store", kSchema));
  // Above the counter and above every number a row holds, set-aside ones included: a counter
  // lost or rolled back never hands out a number twice.
  int64_t next = 1;
  for (const char* sql :
       {"SELECT value FROM counters WHERE name = 'next_job_number'",
        "SELECT max(number) + 1 FROM jobs", "SELECT max(number) + 1 FROM corrupt_jobs"}) {
    ASSIGN_OR_RETURN(sqlite::Statement statement, sqlite::Prepare(path, db.get(), sql));
    if (sqlite3_step(statement.get()) == SQLITE_ROW) {
      next = std::max<int64_t>(next, sqlite3_column_int64(statement.get(), 0));
    }
  }
  JobStore store(std::move(db), path, next);
  if (const std::string jobs_dir = state_dir + "/jobs"; IsDirectory(jobs_dir)) {
    RETURN_IF_ERROR(store.ImportJsonFiles(jobs_dir));
  }
  return store;
}

// The older store kept a JSON file per job and the counter in a file beside them. Each readable
// file becomes a row (a number already stored keeps its row: an import cut short by a crash is
// finished, never applied twice); the files are removed once the rows are committed. Unreadable
// files are renamed *.corrupt, as that store did, and their numbers stay used.
absl::Status JobStore::ImportJsonFiles(const std::string& jobs_dir) {
  if (const int removed = RemoveStaleTemporaries(jobs_dir); removed > 0) {
    RLOG(WARNING) << "job store: removed " << removed << " temporary files left by a crash";
  }
  if (auto counter = ReadFileToString(jobs_dir + "/" + kCounter, 64); counter.ok()) {
    int64_t stored = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(*counter), &stored) && stored > 0) {
      next_number_ = std::max(next_number_, stored);
    }
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(jobs_dir));
  CachingTypeResolver resolver;
  const std::string job_type =
      absl::StrCat(CachingTypeResolver::kUrlPrefix, "/", v1::Job::descriptor()->full_name());
  std::vector<std::pair<std::string, v1::Job>> imported;
  for (const std::string& name : names) {
    next_number_ = std::max(next_number_, NumberOfFile(name) + 1);
    const std::string path = jobs_dir + "/" + name;
    if (!absl::EndsWith(name, ".json") || name[0] == '.' || IsDirectory(path)) continue;
    auto text = ReadFileToString(path, kMaxJobBytes);
    v1::Job job;
    absl::Status status = text.status();
    if (text.ok()) {
      int64_t number = 0;
      std::string binary;
      auto parsed = google::protobuf::util::JsonToBinaryString(&resolver, job_type, *text, &binary);
      if (!parsed.ok()) {
        status = absl::DataLossError(parsed.ToString());
      } else if (!job.ParseFromString(binary)) {
        status = absl::DataLossError("the JSON does not make a job");
      } else if (!ParseJobId(job.job_id(), &number) || NumberOfFile(name) != number) {
        status = absl::DataLossError("the job id inside does not match the file name");
      }
    }
    if (!status.ok()) {
      RLOG(ERROR) << "job store: " << path << " is unreadable (" << status << "); moved aside to "
                  << path << ".corrupt";
      ::rename(path.c_str(), (path + ".corrupt").c_str());
      continue;
    }
    imported.emplace_back(path, std::move(job));
  }
  RETURN_IF_ERROR(InTransaction([&]() -> absl::Status {
    for (const auto& [path, job] : imported) {
      ASSIGN_OR_RETURN(const std::string record, Serialize(job));
      ASSIGN_OR_RETURN(sqlite::Statement insert,
                       Prepare("INSERT OR IGNORE INTO jobs (number, record) VALUES (?1, ?2)"));
      int64_t number = 0;
      ParseJobId(job.job_id(), &number);
      sqlite3_bind_int64(insert.get(), 1, number);
      BindBlob(insert.get(), 2, record);
      if (sqlite3_step(insert.get()) != SQLITE_DONE) return Error("importing a job file");
    }
    ASSIGN_OR_RETURN(sqlite::Statement counter,
                     Prepare("INSERT OR REPLACE INTO counters (name, value) VALUES (?1, ?2)"));
    sqlite3_bind_text(counter.get(), 1, kCounter, -1, SQLITE_STATIC);
    sqlite3_bind_int64(counter.get(), 2, next_number_);
    if (sqlite3_step(counter.get()) != SQLITE_DONE) return Error("importing the job counter");
    return absl::OkStatus();
  }));
  for (const auto& [path, job] : imported) (void)RemoveTree(path);
  if (!imported.empty()) {
    RLOG(INFO) << "job store: imported " << imported.size() << " job files from " << jobs_dir
               << " into " << path_;
  }
  return absl::OkStatus();
}

absl::Status JobStore::ForEach(const std::function<void(v1::Job)>& visit) {
  ASSIGN_OR_RETURN(sqlite::Statement select,
                   Prepare("SELECT number, record FROM jobs ORDER BY number"));
  std::vector<std::pair<int64_t, std::string>> corrupt;  // number, why
  int result;
  while ((result = sqlite3_step(select.get())) == SQLITE_ROW) {
    const int64_t number = sqlite3_column_int64(select.get(), 0);
    const void* bytes = sqlite3_column_blob(select.get(), 1);
    const int size = sqlite3_column_bytes(select.get(), 1);
    v1::Job job;
    if (!job.ParseFromArray(bytes, size)) {
      corrupt.emplace_back(number, "the record does not parse as a job");
    } else if (job.job_id() != JobId(number)) {
      corrupt.emplace_back(number, "the job id inside does not match the row's number");
    } else {
      visit(std::move(job));
    }
  }
  if (result != SQLITE_DONE) return Error("reading the jobs");
  select.reset();
  for (const auto& [number, why] : corrupt) {
    RLOG(ERROR) << "job store: " << path_ << ": job-" << number << " is unreadable (" << why
                << "); moved to its corrupt_jobs table";
    RETURN_IF_ERROR(InTransaction([&, number = number, why = why]() -> absl::Status {
      ASSIGN_OR_RETURN(sqlite::Statement move,
                       Prepare("INSERT OR REPLACE INTO corrupt_jobs (number, record, reason) "
                               "SELECT number, record, ?2 FROM jobs WHERE number = ?1"));
      sqlite3_bind_int64(move.get(), 1, number);
      sqlite3_bind_text(move.get(), 2, why.data(), static_cast<int>(why.size()), SQLITE_TRANSIENT);
      if (sqlite3_step(move.get()) != SQLITE_DONE) return Error("setting a record aside");
      return Remove(number);
    }));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobStore::Get(int64_t number) const {
  ASSIGN_OR_RETURN(sqlite::Statement select, Prepare("SELECT record FROM jobs WHERE number = ?1"));
  sqlite3_bind_int64(select.get(), 1, number);
  const int result = sqlite3_step(select.get());
  if (result == SQLITE_DONE)
    return absl::NotFoundError(absl::StrCat(JobId(number), " is not stored"));
  if (result != SQLITE_ROW) return Error("reading a job");
  v1::Job job;
  if (!job.ParseFromArray(sqlite3_column_blob(select.get(), 0),
                          sqlite3_column_bytes(select.get(), 0))) {
    return absl::DataLossError(absl::StrCat(path_, ": the record of ", JobId(number),
                                            " does not parse; restart the controller to set it "
                                            "aside"));
  }
  return job;
}

absl::StatusOr<std::string> JobStore::Serialize(const v1::Job& job) const {
  std::string record;
  if (!job.SerializeToString(&record)) {
    return absl::InternalError(absl::StrCat("job ", job.job_id(), " cannot be serialized"));
  }
  if (record.size() > kMaxJobBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job.job_id(), " would take ",
                                                   record.size(), " bytes in the store; at most ",
                                                   kMaxJobBytes, " are kept"));
  }
  return record;
}

absl::Status JobStore::Insert(v1::Job* job) {
  const int64_t number = next_number_;
  job->set_job_id(JobId(number));
  ASSIGN_OR_RETURN(const std::string record, Serialize(*job));
  RETURN_IF_ERROR(InTransaction([&]() -> absl::Status {
    ASSIGN_OR_RETURN(sqlite::Statement insert,
                     Prepare("INSERT INTO jobs (number, record) VALUES (?1, ?2)"));
    sqlite3_bind_int64(insert.get(), 1, number);
    BindBlob(insert.get(), 2, record);
    if (sqlite3_step(insert.get()) != SQLITE_DONE) return Error("storing a new job");
    ASSIGN_OR_RETURN(sqlite::Statement counter,
                     Prepare("INSERT OR REPLACE INTO counters (name, value) VALUES (?1, ?2)"));
    sqlite3_bind_text(counter.get(), 1, kCounter, -1, SQLITE_STATIC);
    sqlite3_bind_int64(counter.get(), 2, number + 1);
    if (sqlite3_step(counter.get()) != SQLITE_DONE) return Error("advancing the job counter");
    return absl::OkStatus();
  }));
  next_number_ = number + 1;
  return absl::OkStatus();
}

absl::Status JobStore::Put(const v1::Job& job) {
  int64_t number = 0;
  if (!ParseJobId(job.job_id(), &number)) {
    return absl::InvalidArgumentError(absl::StrCat("'", job.job_id(), "' is not a job id"));
  }
  ASSIGN_OR_RETURN(const std::string record, Serialize(job));
  ASSIGN_OR_RETURN(sqlite::Statement update,
                   Prepare("UPDATE jobs SET record = ?2 WHERE number = ?1"));
  sqlite3_bind_int64(update.get(), 1, number);
  BindBlob(update.get(), 2, record);
  if (sqlite3_step(update.get()) != SQLITE_DONE) return Error("updating a job");
  if (sqlite3_changes(db_.get()) == 0) {
    return absl::NotFoundError(absl::StrCat(JobId(number), " is not stored"));
  }
  return absl::OkStatus();
}

absl::Status JobStore::Remove(int64_t number) {
  ASSIGN_OR_RETURN(sqlite::Statement remove, Prepare("DELETE FROM jobs WHERE number = ?1"));
  sqlite3_bind_int64(remove.get(), 1, number);
  if (sqlite3_step(remove.get()) != SQLITE_DONE) return Error("deleting a job");
  return absl::OkStatus();
}

absl::Status JobStore::InTransaction(const std::function<absl::Status()>& body) {
  if (sqlite3_exec(db_.get(), "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return Error("starting a transaction");
  }
  absl::Status status = body();
  if (status.ok() && sqlite3_exec(db_.get(), "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    status = Error("committing");
  }
  if (!status.ok()) sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
  return status;
}

absl::StatusOr<sqlite::Statement> JobStore::Prepare(const char* sql) const {
  return sqlite::Prepare(path_, db_.get(), sql);
}

absl::Status JobStore::Error(const char* what) const {
  return sqlite::Error(path_, db_.get(), what);
}

}  // namespace rlhfd::controller

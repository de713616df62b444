// Checkpoint files (worker/roles/checkpoint): each file's size and CRC-32C in the manifest, the
// commit record, and loads that pass over a damaged newest step for the intact one before it,
// naming the file: a flipped byte, 4 KiB of 0xFF, truncation, a broken header, an edited or
// missing manifest, a missing step directory, a step never committed, a `latest` naming nothing.
// Retention (trainer.max_ckpt_to_keep), a failed save cleaning up after itself, and a real full
// disk (a small tmpfs, where the test may mount one). Background saves (trainer.async_save): the
// state as it was at the start, a failure told at the wait. The fence of a worker its job left
// behind: its saves and commits refused in the directory and in a bucket (moto), and a part it
// wrote anyway passed over at load.
#include "worker/roles/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/util/crc32c.h"
#include "common/util/files.h"
#include "common/util/s3_uri.h"
#include "tests/support/s3_test_server.h"
#include "tests/support/small_filesystem.h"
#include "tests/support/subprocess.h"
#include "worker/roles/background_save.h"
#include "worker/roles/checkpoint_mirror.h"

namespace rlhfd::roles {
namespace {

using rlhfd::testing::TempDir;
using Json = nlohmann::json;

// A rank's training state: 64 x 64 float64 weights (32 KiB) and a step count.
train::TrainedModel::NamedTensors State(double value) {
  return {{"layer.weight", at::full({64, 64}, value, at::kDouble)},
          {"optimizer.step", at::full({1}, value, at::kLong)}};
}

// Attempt `attempt` of the job `job_id` submitted at `submitted_ms`, as a checkpoint call names
// its writer.
CheckpointWriter Attempt(int64_t attempt, const std::string& job_id = "job-1",
                         int64_t submitted_ms = 1000) {
  return {.job_id = job_id, .job_submit_time_ms = submitted_ms, .attempt = attempt};
}

std::vector<RolePart> Parts(const train::TrainedModel::NamedTensors& state) {
  return {RolePart{.role = "actor", .rank = 0, .state = state}};
}

// Saves and commits `step` with every value `step`.
void SaveStep(const std::string& dir, int64_t step) {
  REQUIRE(SaveRoleState(dir, step, "actor", 0, State(static_cast<double>(step)),
                        {{"optimizer_steps", step}}, Attempt(1))
              .ok());
  REQUIRE(CommitStep(dir, step, Attempt(1)).ok());
}

std::string StateFile(const std::string& dir, int64_t step) {
  return RankDirectory(dir, step, "actor", 0) + "/state.safetensors";
}
std::string ManifestFile(const std::string& dir, int64_t step) {
  return RankDirectory(dir, step, "actor", 0) + "/manifest.json";
}

void Overwrite(const std::string& path, off_t offset, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, bytes.data(), bytes.size(), offset) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

void FlipByte(const std::string& path, off_t offset) {
  auto text = ReadFileToString(path);
  REQUIRE(text.ok());
  REQUIRE(offset < static_cast<off_t>(text->size()));
  Overwrite(path, offset, std::string(1, static_cast<char>((*text)[offset] ^ 0x01)));
}

int64_t FileSize(const std::string& path) {
  auto text = ReadFileToString(path);
  REQUIRE(text.ok());
  return static_cast<int64_t>(text->size());
}

// Every tensor of `state` holds `value`.
bool Holds(const train::TrainedModel::NamedTensors& state, double value) {
  for (const auto& [name, tensor] : state) {
    if (!at::equal(tensor, at::full_like(tensor, value))) return false;
  }
  return true;
}

TEST_CASE("a saved step records each file's size and CRC-32C and loads bitwise", "[checkpoint]") {
  TempDir dir;
  SaveStep(dir.path(), 1);
  auto text = ReadFileToString(ManifestFile(dir.path(), 1));
  REQUIRE(text.ok());
  const Json manifest = Json::parse(*text);
  CHECK(manifest["version"] == 2);
  const Json& file = manifest["files"]["state.safetensors"];
  auto sum = Crc32cOfFile(StateFile(dir.path(), 1));
  REQUIRE(sum.ok());
  CHECK(file["bytes"] == sum->bytes);
  CHECK(file["crc32c"] == Crc32cHex(sum->crc32c));
  CHECK(manifest["manifest_crc32c"].is_string());
  auto commit = ReadFileToString(StepDirectory(dir.path(), 1) + "/commit.json");
  REQUIRE(commit.ok());
  CHECK(Json::parse(*commit)["step"] == 1);
  CHECK(Json::parse(*commit)["parts"] == Json::array({"actor/rank_0"}));
  CHECK(*ReadFileToString(dir.path() + "/latest") == "step_1\n");
  CHECK(VerifyRoleState(dir.path(), 1, "actor", 0).ok());

  const auto state = State(0);
  auto loaded = LoadNewestIntact(dir.path(), 0, Parts(state));
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 1);
  CHECK(loaded->passed_over.empty());
  CHECK(loaded->extras.at(0)["optimizer_steps"] == 1);
  CHECK(Holds(state, 1));
  // No checkpoint at all: NOT_FOUND, which a new job takes as "start afresh".
  TempDir empty;
  CHECK(absl::IsNotFound(LoadNewestIntact(empty.path(), 0, Parts(state)).status()));
}

struct Damage {
  std::string name;
  std::function<void(const std::string& dir)> apply;        // to step 3 of `dir`
  std::function<std::string(const std::string& dir)> file;  // the path the note must name
  std::string why;                                          // words the note must hold
};

std::vector<Damage> Damages() {
  const auto state = [](const std::string& dir) { return StateFile(dir, 3); };
  const auto manifest = [](const std::string& dir) { return ManifestFile(dir, 3); };
  return {
      {"a flipped bit in the tensor data",
       [=](const std::string& dir) { FlipByte(state(dir), 20000); }, state, "its CRC-32C is"},
      {"4 KiB of 0xFF over the data",
       [=](const std::string& dir) { Overwrite(state(dir), 8192, std::string(4096, '\xff')); },
       state, "the content changed after the save"},
      {"truncation",
       [=](const std::string& dir) {
         REQUIRE(::truncate(state(dir).c_str(), FileSize(state(dir)) / 2) == 0);
       },
       state, "where its manifest recorded"},
      {"a broken header",
       [=](const std::string& dir) { Overwrite(state(dir), 0, std::string(8, '\xff')); }, state,
       "its CRC-32C is"},
      {"a missing manifest",
       [=](const std::string& dir) { REQUIRE(RemoveTree(manifest(dir)).ok()); }, manifest,
       "is missing"},
      {"an edited manifest",
       [=](const std::string& dir) {
         auto text = ReadFileToString(manifest(dir));
         REQUIRE(text.ok());
         const std::string edited =
             absl::StrReplaceAll(*text, {{"\"optimizer_steps\": 3", "\"optimizer_steps\": 4"}});
         REQUIRE(edited != *text);
         REQUIRE(WriteFileAtomically(manifest(dir), edited).ok());
       },
       manifest, "does not match its own CRC-32C"},
      {"a missing step directory",
       [](const std::string& dir) { REQUIRE(RemoveTree(StepDirectory(dir, 3)).ok()); },
       [](const std::string& dir) { return StepDirectory(dir, 3); }, "is missing"},
      {"a step saved but never committed",
       [](const std::string& dir) {
         REQUIRE(RemoveTree(StepDirectory(dir, 3) + "/commit.json").ok());
       },
       [](const std::string& dir) { return StepDirectory(dir, 3) + "/commit.json"; },
       "never committed"},
  };
}

TEST_CASE("damage to the newest step falls back to the step before, naming the file",
          "[checkpoint]") {
  for (const Damage& damage : Damages()) {
    INFO(damage.name);
    TempDir dir;
    for (int64_t step = 1; step <= 3; ++step) SaveStep(dir.path(), step);
    damage.apply(dir.path());
    // By `latest` (a new job resuming), and by number (a recovering job's record).
    for (const int64_t asked : {0, 3}) {
      INFO("asked for step " << asked);
      const auto state = State(0);
      auto loaded = LoadNewestIntact(dir.path(), asked, Parts(state));
      INFO(loaded.status().ToString());
      REQUIRE(loaded.ok());
      CHECK(loaded->step == 2);
      CHECK(Holds(state, 2));
      CHECK(loaded->extras.at(0)["optimizer_steps"] == 2);
      REQUIRE(loaded->passed_over.size() == 1);
      const std::string& note = loaded->passed_over[0];
      CHECK_THAT(note, Catch::StartsWith("step 3: " + damage.file(dir.path())));
      CHECK_THAT(note, Catch::Contains(damage.why));
    }
    if (damage.name != "a missing step directory" &&
        damage.name != "a step saved but never committed") {
      CHECK(absl::IsDataLoss(VerifyRoleState(dir.path(), 3, "actor", 0).status()));
    }
  }
}

TEST_CASE("a `latest` that names nothing or garbage is passed over for the newest committed step",
          "[checkpoint]") {
  TempDir dir;
  for (int64_t step = 1; step <= 3; ++step) SaveStep(dir.path(), step);
  REQUIRE(WriteFileAtomically(dir.path() + "/latest", "step_9\n").ok());
  const auto state = State(0);
  auto loaded = LoadNewestIntact(dir.path(), 0, Parts(state));
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 3);
  REQUIRE(loaded->passed_over.size() == 1);
  CHECK_THAT(loaded->passed_over[0],
             Catch::Contains(StepDirectory(dir.path(), 9) + ": is missing"));

  REQUIRE(WriteFileAtomically(dir.path() + "/latest", "\xff\xfegarbage").ok());
  loaded = LoadNewestIntact(dir.path(), 0, Parts(state));
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 3);
  REQUIRE(loaded->passed_over.size() == 1);
  CHECK_THAT(loaded->passed_over[0], Catch::Contains(dir.path() + "/latest: does not name a step"));
}

TEST_CASE("with no intact step the load fails naming every bad file", "[checkpoint]") {
  TempDir dir;
  for (int64_t step = 1; step <= 2; ++step) SaveStep(dir.path(), step);
  FlipByte(StateFile(dir.path(), 2), 100);
  REQUIRE(RemoveTree(ManifestFile(dir.path(), 1)).ok());
  const auto state = State(7);
  auto loaded = LoadNewestIntact(dir.path(), 0, Parts(state));
  REQUIRE_FALSE(loaded.ok());
  CHECK(absl::IsDataLoss(loaded.status()));
  const std::string message(loaded.status().message());
  CHECK_THAT(message, Catch::Contains("no intact checkpoint in " + dir.path()));
  CHECK_THAT(message, Catch::Contains("step 2: " + StateFile(dir.path(), 2)));
  CHECK_THAT(message, Catch::Contains("step 1: " + ManifestFile(dir.path(), 1) + ": is missing"));
  CHECK(Holds(state, 7));  // nothing was copied
}

TEST_CASE("an intact step that does not fit the rank's state is refused without falling back",
          "[checkpoint]") {
  TempDir dir;
  for (int64_t step = 1; step <= 2; ++step) SaveStep(dir.path(), step);
  train::TrainedModel::NamedTensors other = {{"layer.weight", at::zeros({32, 64}, at::kDouble)},
                                             {"optimizer.step", at::zeros({1}, at::kLong)}};
  auto loaded = LoadNewestIntact(dir.path(), 0, Parts(other));
  REQUIRE_FALSE(loaded.ok());
  CHECK(absl::IsInvalidArgument(loaded.status()));
  CHECK_THAT(
      std::string(loaded.status().message()),
      Catch::Contains(RankDirectory(dir.path(), 2, "actor", 0) + ": layer.weight is [64, 64]"));
}

TEST_CASE("a version-1 save (before checksums) loads when `latest` names it", "[checkpoint]") {
  TempDir dir;
  SaveStep(dir.path(), 1);
  auto text = ReadFileToString(ManifestFile(dir.path(), 1));
  REQUIRE(text.ok());
  Json manifest = Json::parse(*text);
  manifest["version"] = 1;
  manifest.erase("files");
  manifest.erase("manifest_crc32c");
  REQUIRE(WriteFileAtomically(ManifestFile(dir.path(), 1), manifest.dump(1)).ok());
  REQUIRE(RemoveTree(StepDirectory(dir.path(), 1) + "/commit.json").ok());
  const auto state = State(0);
  auto loaded = LoadNewestIntact(dir.path(), 0, Parts(state));
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 1);
  CHECK(Holds(state, 1));
  // Its header is still checked: a broken one is passed over like any damage.
  Overwrite(StateFile(dir.path(), 1), 0, std::string(8, '\xff'));
  CHECK(absl::IsDataLoss(LoadNewestIntact(dir.path(), 0, Parts(state)).status()));
}

std::vector<std::string> StepDirs(const std::string& dir) {
  std::vector<std::string> steps;
  const auto names = ListDirectory(dir);
  REQUIRE(names.ok());
  for (const std::string& name : *names) {
    if (name.rfind("step_", 0) == 0) steps.push_back(name);
  }
  return steps;
}

TEST_CASE("retention keeps the newest committed steps, never the one just committed",
          "[checkpoint]") {
  TempDir dir;
  // Step 1's save was cut short (no commit record); it goes with the old committed ones.
  REQUIRE(SaveRoleState(dir.path(), 1, "actor", 0, State(1), Json::object(), Attempt(1)).ok());
  for (int64_t step = 2; step <= 5; ++step) SaveStep(dir.path(), step);
  auto removed = RemoveOldSteps(dir.path(), 5, 2);
  REQUIRE(removed.ok());
  CHECK(removed->size() == 3);
  CHECK(StepDirs(dir.path()) == std::vector<std::string>{"step_4", "step_5"});
  // 0 keeps everything.
  REQUIRE(RemoveOldSteps(dir.path(), 5, 0).ok());
  CHECK(StepDirs(dir.path()).size() == 2);
  // After a resume went back to step 5 from a damaged step 7, step 6 is committed again while
  // the stale step 7 still exists: keep 1 keeps step 6 (just committed), not the newer step 7.
  SaveStep(dir.path(), 7);
  SaveStep(dir.path(), 6);
  removed = RemoveOldSteps(dir.path(), 6, 1);
  REQUIRE(removed.ok());
  CHECK(StepDirs(dir.path()) == std::vector<std::string>{"step_6", "step_7"});
}

TEST_CASE("a save again of a committed step un-commits it first; a failed save leaves nothing",
          "[checkpoint]") {
  TempDir dir;
  for (int64_t step = 1; step <= 2; ++step) SaveStep(dir.path(), step);
  // Complex tensors cannot go into safetensors: the save of step 2 fails after it began.
  train::TrainedModel::NamedTensors bad = {
      {"layer.weight", at::zeros({2, 2}, at::TensorOptions().dtype(at::kComplexDouble))}};
  auto saved = SaveRoleState(dir.path(), 2, "actor", 0, bad, Json::object(), Attempt(1));
  REQUIRE_FALSE(saved.ok());
  CHECK_FALSE(PathExists(StepDirectory(dir.path(), 2) + "/commit.json"));
  CHECK_FALSE(PathExists(RankDirectory(dir.path(), 2, "actor", 0)));
  // `latest` still names step 2, which is no longer a whole step: step 1 loads.
  const auto state = State(0);
  auto loaded = LoadNewestIntact(dir.path(), 0, Parts(state));
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 1);
}

TEST_CASE(
    "a full disk fails the save with RESOURCE_EXHAUSTED naming the path, leaving no "
    "partial file",
    "[checkpoint]") {
  TempDir dir;
  std::string why;
  auto small = testing::SmallFilesystem::Mount(dir.path() + "/small", 1 << 20, &why);
  if (!small) {
    WARN("not tested with a real ENOSPC: " << why);
    return;
  }
  const std::string checkpoints = small->path() + "/checkpoints";
  SaveStep(checkpoints, 1);
  small->Fill();
  auto saved = SaveRoleState(checkpoints, 2, "actor", 0, State(2), Json::object(), Attempt(1));
  REQUIRE_FALSE(saved.ok());
  CHECK(absl::IsResourceExhausted(saved.status()));
  CHECK_THAT(
      std::string(saved.status().message()),
      Catch::Contains(StepDirectory(checkpoints, 2)) && Catch::Contains("No space left on device"));
  CHECK_FALSE(PathExists(RankDirectory(checkpoints, 2, "actor", 0)));
  // Space back: the same save succeeds, and step 1 stayed intact throughout.
  small->Free();
  REQUIRE(SaveRoleState(checkpoints, 2, "actor", 0, State(2), Json::object(), Attempt(1)).ok());
  REQUIRE(CommitStep(checkpoints, 2, Attempt(1)).ok());
  CHECK(VerifyRoleState(checkpoints, 1, "actor", 0).ok());
  CHECK(VerifyRoleState(checkpoints, 2, "actor", 0).ok());
}

TEST_CASE("a background save writes the state as it was when it started, and waits for itself",
          "[checkpoint][async_save]") {
  TempDir dir;
  SaveStep(dir.path(), 1);
  train::TrainedModel::NamedTensors state = State(2);
  std::unique_ptr<BackgroundSave> save = BackgroundSave::Start(
      dir.path(), 2, Attempt(1),
      {{.role = "actor", .rank = 0, .state = state, .extra = {{"optimizer_steps", 2}}}});
  CHECK(save->step() == 2);
  CHECK(save->copied_bytes() == 64 * 64 * 8 + 8);
  // Training goes on: the tensors the save was given change at once.
  for (auto& [name, tensor] : state) tensor.fill_(3);
  const absl::StatusOr<int64_t> written = save->Wait();
  REQUIRE(written.ok());
  CHECK(*written == 64 * 64 * 8 + 8);
  CHECK(save->Wait().ok());  // a second wait answers the same
  // Written, not committed: `latest` still names step 1 until the step is committed.
  REQUIRE(VerifyRoleState(dir.path(), 2, "actor", 0).ok());
  CHECK_FALSE(PathExists(StepDirectory(dir.path(), 2) + "/commit.json"));
  REQUIRE(CommitStep(dir.path(), 2, Attempt(1)).ok());
  train::TrainedModel::NamedTensors loaded = State(0);
  auto step = LoadNewestIntact(dir.path(), 0, Parts(loaded));
  REQUIRE(step.ok());
  CHECK(step->step == 2);
  CHECK(Holds(loaded, 2));  // not 3

  // A save whose owner goes without waiting is still written whole (the destructor waits).
  BackgroundSave::Start(dir.path(), 3, Attempt(1),
                        {{.role = "actor", .rank = 0, .state = State(3)}})
      .reset();
  CHECK(VerifyRoleState(dir.path(), 3, "actor", 0).ok());
}

TEST_CASE("a background save that fails says why when waited for, and leaves no partial files",
          "[checkpoint][async_save]") {
  TempDir dir;
  train::TrainedModel::NamedTensors bad = {
      {"layer.weight", at::zeros({2, 2}, at::TensorOptions().dtype(at::kComplexDouble))}};
  std::unique_ptr<BackgroundSave> save = BackgroundSave::Start(
      dir.path(), 1, Attempt(1), {{.role = "actor", .rank = 0, .state = bad}});
  const absl::StatusOr<int64_t> written = save->Wait();
  REQUIRE_FALSE(written.ok());
  CHECK_FALSE(written.status().message().empty());
  CHECK_FALSE(PathExists(RankDirectory(dir.path(), 1, "actor", 0)));
  // NaN in the state: refused naming the tensor, as a foreground save refuses it.
  train::TrainedModel::NamedTensors nan = {{"layer.weight", at::full({2}, NAN, at::kFloat)}};
  const absl::StatusOr<int64_t> refused =
      BackgroundSave::Start(dir.path(), 2, Attempt(1), {{.role = "actor", .rank = 0, .state = nan}})
          ->Wait();
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("layer.weight"));
}

// A worker the job left behind: attempt 1 of job-1, cut off by a partition its cancellation did
// not cross, still writing after attempt 2 took over.
TEST_CASE("a worker the job left behind can neither save nor commit over a later attempt's steps",
          "[checkpoint][fence]") {
  TempDir dir;
  const std::string checkpoints = dir.path();
  // Attempt 1 saved step 3 before it was cut off; attempt 2 then committed steps 1 and 2.
  REQUIRE(SaveRoleState(checkpoints, 3, "actor", 0, State(-3), Json::object(), Attempt(1)).ok());
  for (int64_t step = 1; step <= 2; ++step) {
    REQUIRE(SaveRoleState(checkpoints, step, "actor", 0, State(static_cast<double>(step)),
                          Json::object(), Attempt(2))
                .ok());
    REQUIRE(CommitStep(checkpoints, step, Attempt(2)).ok());
  }
  const absl::Status commit = CommitStep(checkpoints, 3, Attempt(1));
  CHECK(commit.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(commit.message()),
             Catch::Contains("attempt 1 of job job-1 (submitted at 1000 ms) was left behind: "
                             "step 2 was committed by its attempt 2"));
  CHECK_FALSE(PathExists(checkpoints + "/step_3/commit.json"));
  CHECK(ReadFileToString(checkpoints + "/latest").value() == "step_2\n");
  // Its save of a step attempt 2 committed would un-commit it first: refused, nothing changed.
  const absl::StatusOr<int64_t> save =
      SaveRoleState(checkpoints, 2, "actor", 0, State(-2), Json::object(), Attempt(1));
  CHECK(save.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(PathExists(checkpoints + "/step_2/commit.json"));
  train::TrainedModel::NamedTensors state = State(0);
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestIntact(checkpoints, 0, Parts(state));
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 2);
  CHECK(Holds(state, 2));
  // A new controller's job-1 (submitted later) resuming from this directory is another job:
  // not fenced.
  const CheckpointWriter new_job = Attempt(1, "job-1", 2000);
  REQUIRE(SaveRoleState(checkpoints, 3, "actor", 0, State(3), Json::object(), new_job).ok());
  REQUIRE(CommitStep(checkpoints, 3, new_job).ok());
  loaded = LoadNewestIntact(checkpoints, 0, Parts(state));
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 3);
  CHECK(Holds(state, 3));
}

TEST_CASE("a commit aborts on a part another attempt of the job saved", "[checkpoint][fence]") {
  TempDir dir;
  REQUIRE(SaveRoleState(dir.path(), 1, "actor", 0, State(1), Json::object(), Attempt(1)).ok());
  REQUIRE(SaveRoleState(dir.path(), 1, "critic", 0, State(1), Json::object(), Attempt(2)).ok());
  const absl::Status commit = CommitStep(dir.path(), 1, Attempt(2));
  CHECK(commit.code() == absl::StatusCode::kAborted);  // a fault: the job recovers
  CHECK_THAT(std::string(commit.message()),
             Catch::Contains("step_1/actor/rank_0/manifest.json was saved by attempt 1 of job "
                             "job-1 (submitted at 1000 ms), not by attempt 2 of job job-1"));
  CHECK_FALSE(PathExists(dir.path() + "/step_1/commit.json"));
  CHECK_FALSE(PathExists(dir.path() + "/latest"));
}

TEST_CASE("a committed step holding a part another attempt wrote after the commit is passed over",
          "[checkpoint][fence]") {
  TempDir dir, elsewhere;
  for (int64_t step = 1; step <= 2; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      REQUIRE(SaveRoleState(dir.path(), step, "actor", rank, State(static_cast<double>(step)),
                            Json::object(), Attempt(2))
                  .ok());
    }
    REQUIRE(CommitStep(dir.path(), step, Attempt(2)).ok());
  }
  // Attempt 1's rank 1 part of step 2, written where no fence could see (its own directory), lands
  // over attempt 2's after the commit: a write that raced the check.
  REQUIRE(
      SaveRoleState(elsewhere.path(), 2, "actor", 1, State(-2), Json::object(), Attempt(1)).ok());
  const std::string part = RankDirectory(dir.path(), 2, "actor", 1);
  for (const char* name : {"state.safetensors", "manifest.json"}) {
    const absl::StatusOr<std::string> file =
        ReadFileToString(absl::StrCat(RankDirectory(elsewhere.path(), 2, "actor", 1), "/", name));
    REQUIRE(file.ok());
    REQUIRE(WriteFileAtomically(absl::StrCat(part, "/", name), *file).ok());
  }
  train::TrainedModel::NamedTensors state = State(0);
  const absl::StatusOr<LoadedCheckpoint> loaded =
      LoadNewestIntact(dir.path(), 0, {RolePart{.role = "actor", .rank = 1, .state = state}});
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 1);
  CHECK(Holds(state, 1));
  REQUIRE(loaded->passed_over.size() == 1);
  CHECK_THAT(loaded->passed_over[0],
             Catch::Contains("step_2/actor/rank_1/manifest.json: was saved by attempt 1 of job "
                             "job-1 (submitted at 1000 ms) but step 2 was committed by attempt 2"));
}

TEST_CASE("the bucket fences a worker the job left behind as the directory does",
          "[checkpoint][fence][s3]") {
  TempDir dir;
  rlhfd::testing::S3TestServer server(dir.path());
  REQUIRE(server.ok());
  net::S3Options options;
  options.endpoint = server.endpoint();
  options.credentials = {.access_key_id = "rlhfd-test", .secret_access_key = "rlhfd-test-secret"};
  options.first_backoff = absl::Milliseconds(10);
  REQUIRE(net::S3Client("rlhfd-fence", options).CreateBucket().ok());
  const absl::StatusOr<S3Location> location = ParseS3Uri("s3://rlhfd-fence/job-1");
  REQUIRE(location.ok());
  CheckpointMirror mirror(*location, options);
  // Attempt 2 saves and commits step 1, in its directory and in the bucket.
  const std::string checkpoints = dir.path() + "/checkpoints";
  REQUIRE(SaveRoleState(checkpoints, 1, "actor", 0, State(1), Json::object(), Attempt(2)).ok());
  REQUIRE(mirror.UploadPart(checkpoints, 1, "actor", 0, Attempt(2)).ok());
  REQUIRE(CommitStep(checkpoints, 1, Attempt(2)).ok());
  REQUIRE(mirror.UploadCommit(checkpoints, 1, Attempt(2)).ok());
  // Attempt 1, left behind on a machine of its own, saved and committed step 1 there and uploads.
  const std::string stale = dir.path() + "/stale";
  REQUIRE(SaveRoleState(stale, 1, "actor", 0, State(-1), Json::object(), Attempt(1)).ok());
  REQUIRE(CommitStep(stale, 1, Attempt(1)).ok());
  const absl::Status part = mirror.UploadPart(stale, 1, "actor", 0, Attempt(1));
  CHECK(part.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(part.message()),
             Catch::Contains("attempt 1 of job job-1 (submitted at 1000 ms) was left behind"));
  CHECK(mirror.UploadCommit(stale, 1, Attempt(1)).code() == absl::StatusCode::kFailedPrecondition);
  // A new machine gets attempt 2's step 1 from the bucket.
  const std::string fresh = dir.path() + "/fresh";
  REQUIRE(mirror.EnsurePart(fresh, 1, "actor", 0).ok());
  train::TrainedModel::NamedTensors state = State(0);
  const absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestIntact(fresh, 0, Parts(state));
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 1);
  CHECK(Holds(state, 1));
}

}  // namespace
}  // namespace rlhfd::roles

#include "worker/roles/role_host.h"

#include <ATen/ATen.h>
#include <malloc.h>

#include <chrono>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging/logging.h"
#include "common/rpc/pending_unary.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "common/util/text.h"
#include "worker/model/model_export.h"
#include "worker/model/safetensors_writer.h"
#include "worker/parallel/socket_communicator.h"
#include "worker/parallel/transfer.h"
#include "worker/roles/actor_role.h"
#include "worker/roles/advantage_stage.h"
#include "worker/roles/checkpoint.h"
#include "worker/roles/critic_role.h"
#include "worker/roles/frozen_roles.h"
#include "worker/roles/job_layout.h"
#include "worker/roles/prompt_encoding.h"
#include "worker/roles/response_scorer.h"
#include "worker/roles/step_batch.h"
#ifdef RLHFD_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>

#include "worker/parallel/nccl_communicator.h"
#endif

namespace rlhfd::roles {

// Rank 0's rendezvous, between PrepareJob and StartJob.
struct PreparedJob {
  int64_t attempt = 0;
  std::chrono::steady_clock::time_point arrived;  // when PrepareJob reached this worker
  std::unique_ptr<parallel::RendezvousListener> listener;
  v1::Bootstrap bootstrap;
};

// A job as this worker hosts it.
struct HostedJob {
  std::string id;
  int64_t attempt = 0;
  std::chrono::steady_clock::time_point arrived;  // when StartJob reached this worker
  v1::JobSpec spec;
  std::unique_ptr<JobLayout> layout;
  std::unique_ptr<parallel::Communicator> world;
  std::map<std::string, std::unique_ptr<parallel::Communicator>> pools;  // role → its pool's
  std::unique_ptr<ActorRole> actor;
  std::unique_ptr<CriticRole> critic;
  std::unique_ptr<ReferenceRole> reference;
  std::unique_ptr<RewardModelRole> reward_model;
  std::unique_ptr<ResponseScorer> scorer;  // rule / remote rewards, on the actor ranks
  StepBatch batch;
  v1::StartJobReply started;
  // Successful replies by key, serialized; the last two steps' are kept.
  std::map<std::pair<int64_t, std::string>, std::string> replies;
  // Set when an update failed midway: the weights are in doubt until a checkpoint loads.
  std::string poisoned;
  std::shared_ptr<std::atomic<bool>> cancelled;
};

namespace {

constexpr size_t kMaxStageName = 128;

std::string KeyText(const v1::StageKey& key) {
  return absl::StrCat("job ", SanitizeForDisplay(key.job_id(), 80), " step ", key.step(), " ",
                      SanitizeForDisplay(key.stage(), 60));
}

// Every call names its job's attempt (from 1), so a call cannot reach whichever attempt runs.
absl::Status CheckAttempt(int64_t attempt) {
  if (attempt < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("attempt ", attempt, ": a call must name its job's attempt (from 1)"));
  }
  return absl::OkStatus();
}

absl::Status CheckKey(const v1::StageKey& key) {
  if (key.step() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(KeyText(key), ": key.step must be >= 1"));
  }
  if (key.stage().empty() || key.stage().size() > kMaxStageName) {
    return absl::InvalidArgumentError(
        absl::StrCat(KeyText(key), ": key.stage must be 1-", kMaxStageName, " characters"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RandomSecret() {
  std::random_device device;
  std::string secret(parallel::kSocketSecretBytes, '\0');
  for (char& c : secret) c = static_cast<char>(device() & 0xFF);
  return secret;
}

}  // namespace

RoleHost::RoleHost(RoleHostOptions options) : options_(std::move(options)) {}

RoleHost::~RoleHost() {
  {
    std::lock_guard<std::mutex> lock(cancel_mutex_);
    for (auto& [id, flag] : cancel_flags_) flag->store(true);
  }
  executor_.Stop();
}

std::shared_ptr<std::atomic<bool>> RoleHost::CancelFlag(const std::string& key) {
  std::lock_guard<std::mutex> lock(cancel_mutex_);
  auto& flag = cancel_flags_[key];
  if (!flag) flag = std::make_shared<std::atomic<bool>>(false);
  return flag;
}

absl::StatusOr<HostedJob*> RoleHost::FindJob(const std::string& job_id, int64_t attempt) {
  RETURN_IF_ERROR(CheckAttempt(attempt));
  const auto found = jobs_.find(job_id);
  if (found != jobs_.end() && found->second->attempt != attempt) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", SanitizeForDisplay(job_id, 80), " runs attempt ", found->second->attempt,
        " here, not ", attempt, " (a newer driver has taken it over)"));
  }
  if (found == jobs_.end()) {
    // UNAVAILABLE: to the driver this worker cannot serve the job now (it never started it, or
    // it restarted and lost it), which a restart of the job cures.
    return absl::UnavailableError(absl::StrCat("job ", SanitizeForDisplay(job_id, 80),
                                               " is not running on this worker (StartJob first; "
                                               "or the worker restarted)"));
  }
  return found->second.get();
}

template <typename Reply, typename Body>
void RoleHost::RunStage(const v1::StageKey& key, bool mutates, stages::StageDone<Reply> done,
                        Body body) {
  executor_.Post([this, key, mutates, done = std::move(done), body = std::move(body)]() mutable {
    logging::ScopedLogContext context({.job = key.job_id(), .step = key.step()});
    absl::StatusOr<Reply> result = CatchAll<Reply>(key.stage(), [&]() -> absl::StatusOr<Reply> {
      RETURN_IF_ERROR(CheckKey(key));
      ASSIGN_OR_RETURN(HostedJob * job, FindJob(key.job_id(), key.attempt()));
      const std::pair<int64_t, std::string> id(key.step(), key.stage());
      if (const auto stored = job->replies.find(id); stored != job->replies.end()) {
        Reply reply;
        reply.ParseFromString(stored->second);
        return reply;  // a retry: the first call's reply, nothing run again
      }
      if (!job->poisoned.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            KeyText(key), ": ", job->poisoned, "; load a checkpoint before further stages"));
      }
      absl::StatusOr<Reply> reply = body(*job);
      if (!reply.ok()) {
        if (mutates) job->poisoned = absl::StrCat(key.stage(), " of step ", key.step(), " failed");
        return absl::Status(reply.status().code(),
                            absl::StrCat(KeyText(key), ": ", reply.status().message()));
      }
      // Replies of steps before the previous one are no longer retried.
      while (!job->replies.empty() && job->replies.begin()->first.first < key.step() - 1) {
        job->replies.erase(job->replies.begin());
      }
      job->replies[id] = reply->SerializeAsString();
      return reply;
    });
    if (!result.ok()) RLOG(WARNING) << result.status().message();
    done(std::move(result));
  });
}

namespace {

parallel::Communicator& PoolOf(HostedJob& job, const std::string& role) {
  return *job.pools.at(role);
}

absl::Status NeedRole(const HostedJob& job, const std::string& role, bool hosted) {
  if (hosted) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this worker (rank ", job.layout->rank(), ") does not host the job's ", role));
}

// The rows of the step this rank holds as a member of `role`'s pool.
RowRange RowsFor(const HostedJob& job, const std::string& role, int64_t total_rows) {
  return job.layout->RowsOf(role, total_rows);
}

}  // namespace

void RoleHost::PrepareJob(const v1::PrepareJobRequest& request, absl::Duration,
                          stages::StageDone<v1::PrepareJobReply> done) {
  const auto arrived = std::chrono::steady_clock::now();
  executor_.Post([this, request, arrived, done = std::move(done)] {
    const absl::Cleanup publish = [this] { PublishHosted(); };
    done(CatchAll<v1::PrepareJobReply>("PrepareJob", [&]() -> absl::StatusOr<v1::PrepareJobReply> {
      if (request.job_id().empty() || request.job_id().size() > 128) {
        return absl::InvalidArgumentError("PrepareJob: job_id must be 1-128 characters");
      }
      RETURN_IF_ERROR(CheckAttempt(request.attempt()));
      if (const auto running = jobs_.find(request.job_id()); running != jobs_.end()) {
        if (running->second->attempt == request.attempt()) {
          return absl::AlreadyExistsError(absl::StrCat(
              "job ", request.job_id(), " attempt ", request.attempt(), " is already running here"));
        }
        RLOG(INFO) << "job " << request.job_id() << ": attempt " << request.attempt()
                   << " replaces attempt " << running->second->attempt;
        jobs_.erase(running);
        prepared_.erase(request.job_id());
      }
      if (const auto stale = prepared_.find(request.job_id());
          stale != prepared_.end() && stale->second->attempt != request.attempt()) {
        prepared_.erase(stale);
      }
      auto& prepared = prepared_[request.job_id()];
      if (!prepared) {
        prepared = std::make_unique<PreparedJob>();
        prepared->attempt = request.attempt();
        prepared->arrived = arrived;
        if (request.nccl()) {
#ifdef RLHFD_HAVE_CUDA
          ASSIGN_OR_RETURN(std::string id, parallel::NewNcclUniqueId());
          prepared->bootstrap.set_nccl_unique_id(id);
#else
          prepared_.erase(request.job_id());
          return absl::FailedPreconditionError("this worker was built without CUDA (no NCCL)");
#endif
        } else {
          absl::StatusOr<parallel::RendezvousListener> listener =
              parallel::RendezvousListener::Bind(options_.host);
          if (!listener.ok()) {
            prepared_.erase(request.job_id());
            return listener.status();
          }
          prepared->bootstrap.set_socket_master(listener->address());
          prepared->listener = std::make_unique<parallel::RendezvousListener>(*std::move(listener));
        }
        ASSIGN_OR_RETURN(std::string secret, RandomSecret());
        prepared->bootstrap.set_secret(secret);
      }
      v1::PrepareJobReply reply;
      *reply.mutable_bootstrap() = prepared->bootstrap;
      return reply;
    }));
  });
}

void RoleHost::StartJob(const v1::StartJobRequest& request, absl::Duration,
                        stages::StageDone<v1::StartJobReply> done) {
  const auto cancelled = CancelFlag(absl::StrCat(request.job_id(), "#", request.attempt()));
  const auto arrived = std::chrono::steady_clock::now();
  executor_.Post([this, request, cancelled, arrived, done = std::move(done)] {
    logging::ScopedLogContext context({.job = request.job_id(), .rank = request.rank()});
    const absl::Cleanup publish = [this] { PublishHosted(); };
    done(CatchAll<v1::StartJobReply>("StartJob", [&]() -> absl::StatusOr<v1::StartJobReply> {
      const auto start = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(CheckAttempt(request.attempt()));
      if (const auto running = jobs_.find(request.job_id()); running != jobs_.end()) {
        if (running->second->attempt == request.attempt()) return running->second->started;
        // A newer attempt (a recovering driver): the older one's roles and communicators go.
        RLOG(INFO) << "attempt " << request.attempt() << " replaces attempt "
                   << running->second->attempt;
        jobs_.erase(running);
      }
      if (request.job_id().empty()) {
        return absl::InvalidArgumentError("StartJob: job_id is required");
      }
      cancelled->store(false);
      auto job = std::make_unique<HostedJob>();
      job->id = request.job_id();
      job->attempt = request.attempt();
      job->arrived = arrived;
      job->spec = request.spec();
      job->cancelled = cancelled;
      ASSIGN_OR_RETURN(JobLayout layout,
                       JobLayout::Create(request.world_size(), request.rank(), request.pools()));
      job->layout = std::make_unique<JobLayout>(std::move(layout));
      const auto timeout = request.communicator_timeout_ms() > 0
                               ? std::chrono::milliseconds(request.communicator_timeout_ms())
                               : options_.collective_timeout;
      const v1::Bootstrap& bootstrap = request.bootstrap();
      if (!bootstrap.nccl_unique_id().empty()) {
#ifdef RLHFD_HAVE_CUDA
        ASSIGN_OR_RETURN(job->world,
                         parallel::CreateNcclCommunicator(
                             request.rank(), request.world_size(), bootstrap.nccl_unique_id(),
                             options_.device, {.timeout = timeout, .interrupt = cancelled}));
#else
        return absl::FailedPreconditionError("this worker was built without CUDA (no NCCL)");
#endif
      } else {
        if (bootstrap.socket_master().empty() && request.world_size() > 1) {
          return absl::InvalidArgumentError("StartJob: bootstrap has neither a socket master nor "
                                            "an NCCL id (PrepareJob on rank 0 makes one)");
        }
        parallel::SocketOptions socket{
            .master = bootstrap.socket_master().empty() ? "127.0.0.1:1" : bootstrap.socket_master(),
            .timeout = timeout,
            .secret = bootstrap.secret(),
            .interrupt = cancelled};
        std::unique_ptr<PreparedJob> prepared;
        if (request.rank() == 0 && request.world_size() > 1) {
          auto found = prepared_.find(request.job_id());
          if (found == prepared_.end() || !found->second->listener) {
            return absl::FailedPreconditionError(
                "StartJob on rank 0: PrepareJob was not called on this worker for the job");
          }
          prepared = std::move(found->second);
          prepared_.erase(found);
          socket.listener = prepared->listener.get();
        }
        ASSIGN_OR_RETURN(job->world, parallel::CreateSocketCommunicator(
                                         request.rank(), request.world_size(), socket));
      }
      prepared_.erase(request.job_id());
      // A communicator per pool, split from the world in the same order on every rank.
      for (const RolePool& pool : job->layout->pools()) {
        const int position = job->layout->PositionIn(pool.role);
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> split,
                         job->world->Split(position >= 0 ? 0 : -1, position));
        if (split) job->pools[pool.role] = std::move(split);
      }
      const int64_t rl_steps = std::max<int64_t>(1, request.total_steps());
      const v1::JobSpec& spec = job->spec;
      const at::Device device = options_.device;
      if (job->layout->Hosts(kActor)) {
        ASSIGN_OR_RETURN(job->actor,
                         ActorRole::Create(spec, device, PoolOf(*job, kActor), rl_steps));
        ASSIGN_OR_RETURN(job->scorer, ResponseScorer::Create(spec.roles().reward()));
      }
      if (job->layout->Hosts(kCritic)) {
        ASSIGN_OR_RETURN(job->critic,
                         CriticRole::Create(spec, device, PoolOf(*job, kCritic), rl_steps));
      }
      if (job->layout->Hosts(kReference)) {
        ASSIGN_OR_RETURN(job->reference, ReferenceRole::Create(spec, device));
      }
      if (job->layout->Hosts(kReward)) {
        if (spec.roles().reward().model().empty()) {
          return absl::InvalidArgumentError(
              "pools: a reward pool needs roles.reward.model (rule and remote rewards run on the "
              "actor ranks)");
        }
        ASSIGN_OR_RETURN(job->reward_model, RewardModelRole::Create(spec, device));
      }
      v1::StartJobReply reply;
      for (const std::string& role : job->layout->HostedRoles()) reply.add_roles(role);
      reply.set_load_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count());
      job->started = reply;
      RLOG(INFO) << "started rank " << request.rank() << " of " << request.world_size()
                 << " hosting " << reply.roles_size() << " role(s) in " << reply.load_ms() << " ms";
      jobs_[request.job_id()] = std::move(job);
      return reply;
    }));
  });
}

void RoleHost::Generate(const v1::GenerateRequest& request, absl::Duration,
                        stages::StageDone<v1::GenerateReply> done) {
  RunStage<v1::GenerateReply>(
      request.key(), false, std::move(done),
      [request, device = options_.device](HostedJob& job) -> absl::StatusOr<v1::GenerateReply> {
        RETURN_IF_ERROR(NeedRole(job, kActor, job.actor != nullptr));
        const int64_t n = job.spec.roles().actor().rollout().n();
        if (request.total_prompts() < 1 || request.first_prompt() < 0 ||
            request.first_prompt() + request.prompts_size() > request.total_prompts()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "generate: prompts [", request.first_prompt(), ", ",
              request.first_prompt() + request.prompts_size(), ") are not within total_prompts ",
              request.total_prompts()));
        }
        const int64_t total_rows = request.total_prompts() * n;
        const RowRange rows = RowsFor(job, kActor, total_rows);
        if (rows.begin != request.first_prompt() * n) {
          return absl::InvalidArgumentError(absl::StrCat(
              "generate: this rank's rows start at ", rows.begin, ", so its first prompt is ",
              rows.begin / n, ", not ", request.first_prompt()));
        }
        ASSIGN_OR_RETURN(v1::GenerateReply reply,
                         job.actor->Generate(request, total_rows, rows, job.batch));
        if (job.spec.algorithm().adv_estimator() == v1::ADVANTAGE_ESTIMATOR_REMAX) {
          // ReMax's baseline: the greedy response's reward, for each of the prompt's rows.
          if (!job.scorer) {
            return absl::FailedPreconditionError(
                "remax scores its greedy baseline with roles.reward.rule or .remote");
          }
          ASSIGN_OR_RETURN(const std::vector<double> baseline,
                           job.actor->GreedyBaseline(request, *job.scorer, job.cancelled.get()));
          const at::Tensor per_prompt = at::tensor(baseline, at::kDouble).to(at::kFloat);
          RETURN_IF_ERROR(job.batch.Put(
              "reward_baselines",
              per_prompt.repeat_interleave(n).to(device).contiguous()));
        }
        return reply;
      });
}

void RoleHost::MoveTensors(const v1::MoveTensorsRequest& request, absl::Duration,
                           stages::StageDone<v1::MoveTensorsReply> done) {
  RunStage<v1::MoveTensorsReply>(
      request.key(), false, std::move(done),
      [request, device = options_.device](HostedJob& job) -> absl::StatusOr<v1::MoveTensorsReply> {
        const RolePool* from = job.layout->Find(request.from_role());
        const RolePool* to = job.layout->Find(request.to_role());
        if (from == nullptr || to == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(
              "move: the job has no ", from == nullptr ? request.from_role() : request.to_role(),
              " pool"));
        }
        const bool sends = job.layout->Hosts(request.from_role());
        const bool receives = job.layout->Hosts(request.to_role());
        if (!sends && !receives) {
          return absl::FailedPreconditionError(absl::StrCat(
              "move: this rank is in neither the ", from->role, " nor the ", to->role, " pool"));
        }
        const int64_t rows = request.rows();
        const int64_t step = request.key().step();
        StepBatch& batch = job.batch;
        const bool current = batch.begun() && batch.step() == step;
        if (current && (batch.total_rows() != rows || batch.prompt_length() != request.prompt_length() ||
                        batch.response_length() != request.response_length())) {
          return absl::InvalidArgumentError(absl::StrCat(
              "move: step ", step, " has ", batch.total_rows(), " rows with P ",
              batch.prompt_length(), " and R ", batch.response_length(), ", not ", rows, ", ",
              request.prompt_length(), ", ", request.response_length()));
        }
        if (!current) {
          if (sends) {
            return absl::FailedPreconditionError(absl::StrCat(
                "move: this rank holds nothing of step ", step, " to send (generate first)"));
          }
          if (rows < 1 || request.prompt_length() < 1 || request.response_length() < 1) {
            return absl::InvalidArgumentError("move: rows, prompt_length and response_length must be >= 1");
          }
          batch.Begin(step, rows, RowsFor(job, to->role, rows), request.prompt_length(),
                      request.response_length());
        }
        const parallel::TransferPlan plan =
            parallel::TransferPlan::Contiguous(rows, from->ranks, to->ranks);
        v1::MoveTensorsReply reply;
        for (const std::string& name : request.tensors()) {
          ASSIGN_OR_RETURN(const TensorInfo info, FindStepTensor(name));
          at::Tensor local;
          if (sends) {
            ASSIGN_OR_RETURN(local, batch.Get(name, "move"));
          }
          const std::vector<int64_t> row_shape = batch.RowShape(info);
          const at::TensorOptions options =
              at::TensorOptions().dtype(StepBatch::DtypeOf(info)).device(device);
          ASSIGN_OR_RETURN(at::Tensor moved,
                           parallel::ExecuteTransfer(*job.world, plan, local, row_shape, options));
          int64_t row_bytes = StepBatch::DtypeOf(info) == at::kLong ? 8 : 4;
          for (int64_t d : row_shape) row_bytes *= d;
          if (sends) {
            for (int64_t row : plan.SourceRows(job.layout->rank())) {
              if (plan.destination[row] != job.layout->rank()) reply.set_bytes_sent(reply.bytes_sent() + row_bytes);
            }
          }
          if (receives) {
            for (int64_t row : plan.DestinationRows(job.layout->rank())) {
              if (plan.source[row] != job.layout->rank()) {
                reply.set_bytes_received(reply.bytes_received() + row_bytes);
              }
            }
            RETURN_IF_ERROR(batch.Put(name, std::move(moved)));
          }
        }
        return reply;
      });
}

void RoleHost::Forward(const v1::ForwardRequest& request, absl::Duration,
                       stages::StageDone<v1::ForwardReply> done) {
  RunStage<v1::ForwardReply>(
      request.key(), false, std::move(done),
      [request](HostedJob& job) -> absl::StatusOr<v1::ForwardReply> {
        const auto start = std::chrono::steady_clock::now();
        if (!job.batch.begun() || job.batch.step() != request.key().step()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "forward: this rank holds no rows of step ", request.key().step(),
              " (generate, or move them here, first)"));
        }
        switch (request.kind()) {
          case v1::FORWARD_KIND_OLD_LOG_PROBS:
            RETURN_IF_ERROR(NeedRole(job, kActor, job.actor != nullptr));
            RETURN_IF_ERROR(job.actor->ComputeOldLogProbs(job.batch));
            break;
          case v1::FORWARD_KIND_REF_LOG_PROBS:
            RETURN_IF_ERROR(NeedRole(job, kReference, job.reference != nullptr));
            RETURN_IF_ERROR(job.reference->ComputeLogProbs(job.batch));
            break;
          case v1::FORWARD_KIND_VALUES:
            RETURN_IF_ERROR(NeedRole(job, kCritic, job.critic != nullptr));
            RETURN_IF_ERROR(job.critic->ComputeValues(job.batch));
            break;
          case v1::FORWARD_KIND_REWARD_SCORES:
            RETURN_IF_ERROR(NeedRole(job, "reward model", job.reward_model != nullptr));
            RETURN_IF_ERROR(job.reward_model->ComputeScores(job.batch));
            break;
          default:
            return absl::InvalidArgumentError("forward: kind is required");
        }
        v1::ForwardReply reply;
        (*reply.mutable_metrics())["forward_s"] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return reply;
      });
}

void RoleHost::ComputeRewards(const v1::RewardRequest& request, absl::Duration,
                              stages::StageDone<v1::RewardReply> done) {
  RunStage<v1::RewardReply>(
      request.key(), false, std::move(done),
      [request](HostedJob& job) -> absl::StatusOr<v1::RewardReply> {
        RETURN_IF_ERROR(NeedRole(job, kActor, job.actor != nullptr));
        if (!job.scorer) {
          return absl::FailedPreconditionError(
              "rewards: roles.reward.model scores with a REWARD_SCORES forward on the reward pool");
        }
        StepBatch& batch = job.batch;
        if (!batch.begun() || batch.step() != request.key().step()) {
          return absl::FailedPreconditionError(
              absl::StrCat("rewards: step ", request.key().step(), " has not generated here"));
        }
        ASSIGN_OR_RETURN(const at::Tensor ids, batch.Get("input_ids", "rewards"));
        ASSIGN_OR_RETURN(const at::Tensor mask, batch.Get("response_mask", "rewards"));
        const at::Tensor host_ids = ids.narrow(1, batch.prompt_length(), batch.response_length()).cpu();
        const at::Tensor lengths = mask.sum(1).to(at::kLong).cpu();
        std::vector<ScoredResponse> responses;
        for (int64_t row = 0; row < batch.rows().size(); ++row) {
          const int64_t length = lengths[row].item<int64_t>();
          const int64_t* data = host_ids[row].data_ptr<int64_t>();
          const std::vector<int32_t> tokens(data, data + length);
          const RowSource& source = batch.sources().at(row);
          responses.push_back({source.prompt_text,
                               job.actor->tokenizer().Decode(tokens, /*skip_special_tokens=*/true),
                               source.ground_truth_json, source.data_source});
        }
        ASSIGN_OR_RETURN(const std::vector<double> scores,
                         job.scorer->Score(responses, batch.rows().begin, job.cancelled.get()));
        RETURN_IF_ERROR(batch.Put("scores", at::tensor(scores, at::kFloat).to(mask.device())));
        v1::RewardReply reply;
        double total = 0;
        for (double score : scores) {
          reply.add_scores(score);
          total += score;
        }
        (*reply.mutable_metrics())["score_sum"] = total;
        return reply;
      });
}

void RoleHost::ComputeAdvantages(const v1::AdvantageRequest& request, absl::Duration,
                                 stages::StageDone<v1::AdvantageReply> done) {
  RunStage<v1::AdvantageReply>(
      request.key(), false, std::move(done),
      [request](HostedJob& job) -> absl::StatusOr<v1::AdvantageReply> {
        RETURN_IF_ERROR(NeedRole(job, kActor, job.actor != nullptr));
        if (!job.batch.begun() || job.batch.step() != request.key().step()) {
          return absl::FailedPreconditionError(
              absl::StrCat("advantages: step ", request.key().step(), " has not generated here"));
        }
        return roles::ComputeAdvantages(job.spec, request, job.batch, PoolOf(job, kActor));
      });
}

void RoleHost::UpdateActor(const v1::UpdateRequest& request, absl::Duration,
                           stages::StageDone<v1::UpdateReply> done) {
  RunStage<v1::UpdateReply>(request.key(), true, std::move(done),
                            [request](HostedJob& job) -> absl::StatusOr<v1::UpdateReply> {
                              RETURN_IF_ERROR(NeedRole(job, kActor, job.actor != nullptr));
                              return job.actor->Update(request, job.batch);
                            });
}

void RoleHost::UpdateCritic(const v1::UpdateRequest& request, absl::Duration,
                            stages::StageDone<v1::UpdateReply> done) {
  RunStage<v1::UpdateReply>(request.key(), true, std::move(done),
                            [request](HostedJob& job) -> absl::StatusOr<v1::UpdateReply> {
                              RETURN_IF_ERROR(NeedRole(job, kCritic, job.critic != nullptr));
                              return job.critic->Update(request, job.batch);
                            });
}

void RoleHost::Validate(const v1::ValidateRequest& request, absl::Duration,
                        stages::StageDone<v1::ValidateReply> done) {
  RunStage<v1::ValidateReply>(
      request.key(), false, std::move(done),
      [request](HostedJob& job) -> absl::StatusOr<v1::ValidateReply> {
        RETURN_IF_ERROR(NeedRole(job, kActor, job.actor != nullptr));
        if (!job.scorer) {
          return absl::UnimplementedError(
              "validate: validation scores with roles.reward.rule or .remote; a reward model's "
              "validation is not supported yet");
        }
        return job.actor->Validate(request, request.first_prompt(), *job.scorer,
                                   job.cancelled.get());
      });
}

namespace {

// The trained roles this rank hosts with their state, by role name.
std::vector<std::pair<std::string, train::TrainedModel*>> TrainedRoles(HostedJob& job) {
  std::vector<std::pair<std::string, train::TrainedModel*>> trained;
  if (job.actor) trained.emplace_back(kActor, &job.actor->trained());
  if (job.critic) trained.emplace_back(kCritic, &job.critic->trained());
  return trained;
}

// A manifest's "extra" values (its CRC was checked; a version-1 manifest's was not).
int64_t JsonInteger(const nlohmann::json& object, const char* key, int64_t fallback) {
  const auto found = object.find(key);
  return found != object.end() && found->is_number_integer() ? found->get<int64_t>() : fallback;
}
double JsonNumber(const nlohmann::json& object, const char* key, double fallback) {
  const auto found = object.find(key);
  return found != object.end() && found->is_number() ? found->get<double>() : fallback;
}

// The directory a stage request names must be the one the job's config gave under `key`: no
// request makes a worker write, read or probe a path anywhere else (no other absolute path, no
// "..").
absl::Status CheckConfiguredDirectory(const std::string& requested, const std::string& configured,
                                      absl::string_view key) {
  if (configured.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this job sets no ", key, "; a stage request cannot name a directory"));
  }
  const std::string clean = CleanAbsolutePath(requested);
  if (clean.empty() || clean != CleanAbsolutePath(configured)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "directory '", SanitizeForDisplay(requested, 200), "' is not this job's ", key, " (",
        SanitizeForDisplay(configured, 200), "): a stage request may name only that one"));
  }
  return absl::OkStatus();
}

absl::Status CheckCheckpointDirectory(const HostedJob& job, const std::string& requested) {
  return CheckConfiguredDirectory(requested, job.spec.trainer().checkpoint_dir(),
                                  "trainer.checkpoint_dir");
}

}  // namespace

void RoleHost::SaveCheckpoint(const v1::CheckpointRequest& request, absl::Duration,
                              stages::StageDone<v1::CheckpointReply> done) {
  RunStage<v1::CheckpointReply>(
      request.key(), false, std::move(done),
      [request](HostedJob& job) -> absl::StatusOr<v1::CheckpointReply> {
        RETURN_IF_ERROR(CheckCheckpointDirectory(job, request.directory()));
        if (request.step() < 1) return absl::InvalidArgumentError("checkpoint: step must be >= 1");
        v1::CheckpointReply reply;
        for (auto& [role, trained] : TrainedRoles(job)) {
          const int position = job.layout->PositionIn(role);
          const int64_t steps =
              role == kActor ? job.actor->optimizer_steps() : job.critic->optimizer_steps();
          const int64_t skips =
              role == kActor ? job.actor->nonfinite_skips() : job.critic->nonfinite_skips();
          ASSIGN_OR_RETURN(const int64_t bytes,
                           SaveRoleState(request.directory(), request.step(), role, position,
                                         trained->StateTensors(),
                                         {{"optimizer_steps", steps},
                                          {"nonfinite_skips", skips},
                                          {"seed", job.spec.trainer().seed()},
                                          {"kl_coef", request.kl_coef()}}));
          reply.set_bytes(reply.bytes() + bytes);
          reply.set_path(RankDirectory(request.directory(), request.step(), role, position));
          if (role == kActor && request.export_huggingface()) {
            // Gathering sharded weights is a collective: every actor rank takes part, the
            // first writes.
            ASSIGN_OR_RETURN(model::Transformer full, job.actor->FullWeights());
            if (position == 0) {
              RETURN_IF_ERROR(model::ExportHuggingFaceDirectory(
                  full, job.spec.model().path(),
                  absl::StrCat(StepDirectory(request.directory(), request.step()),
                               "/actor/huggingface"),
                  at::kBFloat16));
            }
            job.actor->ReleaseRollout();
          }
        }
        reply.set_step(request.step());
        return reply;
      });
}

void RoleHost::CommitCheckpoint(const v1::CheckpointRequest& request, absl::Duration,
                                stages::StageDone<v1::CheckpointReply> done) {
  RunStage<v1::CheckpointReply>(
      request.key(), false, std::move(done),
      [request](HostedJob& job) -> absl::StatusOr<v1::CheckpointReply> {
        RETURN_IF_ERROR(CheckCheckpointDirectory(job, request.directory()));
        RETURN_IF_ERROR(CommitStep(request.directory(), request.step()));
        // The commit stands whatever happens to the deletion of older steps; a failed one is
        // tried again after the next commit.
        const absl::StatusOr<std::vector<std::string>> removed = RemoveOldSteps(
            request.directory(), request.step(), job.spec.trainer().max_ckpt_to_keep());
        if (!removed.ok()) {
          RLOG(WARNING) << "trainer.max_ckpt_to_keep: " << removed.status().message();
        } else if (!removed->empty()) {
          RLOG(INFO) << "trainer.max_ckpt_to_keep " << job.spec.trainer().max_ckpt_to_keep()
                     << ": deleted " << absl::StrJoin(*removed, ", ");
        }
        v1::CheckpointReply reply;
        reply.set_step(request.step());
        reply.set_path(StepDirectory(request.directory(), request.step()));
        return reply;
      });
}

void RoleHost::LoadCheckpoint(const v1::CheckpointRequest& request, absl::Duration,
                              stages::StageDone<v1::CheckpointReply> done) {
  // Loading is what clears a poisoned job, so it runs outside RunStage's refusal.
  executor_.Post([this, request, done = std::move(done)] {
    logging::ScopedLogContext context({.job = request.key().job_id()});
    done(CatchAll<v1::CheckpointReply>("LoadCheckpoint", [&]() -> absl::StatusOr<v1::CheckpointReply> {
      ASSIGN_OR_RETURN(HostedJob * job, FindJob(request.key().job_id(), request.key().attempt()));
      RETURN_IF_ERROR(CheckCheckpointDirectory(*job, request.directory()));
      std::vector<RolePart> parts;
      for (auto& [role, trained] : TrainedRoles(*job)) {
        parts.push_back({.role = role,
                         .rank = job->layout->PositionIn(role),
                         .state = trained->StateTensors()});
      }
      ASSIGN_OR_RETURN(const LoadedCheckpoint loaded,
                       LoadNewestIntact(request.directory(), request.step(), parts));
      v1::CheckpointReply reply;
      reply.set_step(loaded.step);
      for (const std::string& note : loaded.passed_over) reply.add_passed_over(note);
      for (size_t i = 0; i < parts.size(); ++i) {
        const std::string& role = parts[i].role;
        const nlohmann::json& extra = loaded.extras[i];
        const int64_t steps = JsonInteger(extra, "optimizer_steps", 0);
        const int64_t skips = JsonInteger(extra, "nonfinite_skips", 0);
        reply.set_kl_coef(JsonNumber(extra, "kl_coef", job->spec.algorithm().kl().coef()));
        if (role == kActor) {
          job->actor->set_optimizer_steps(steps);
          job->actor->set_nonfinite_skips(skips);
          job->actor->ReleaseRollout();
          reply.set_optimizer_steps(steps);
        } else {
          job->critic->set_optimizer_steps(steps);
          job->critic->set_nonfinite_skips(skips);
          reply.set_critic_optimizer_steps(steps);
        }
        reply.set_path(RankDirectory(request.directory(), loaded.step, role, parts[i].rank));
      }
      job->poisoned.clear();
      job->replies.clear();
      job->batch.Begin(0, 0, {}, 0, 0);
      RLOG(INFO) << "loaded step " << loaded.step << " from " << request.directory();
      return reply;
    }));
  });
}

void RoleHost::Offload(const v1::OffloadRequest& request, absl::Duration,
                       stages::StageDone<v1::OffloadReply> done) {
  RunStage<v1::OffloadReply>(
      request.key(), false, std::move(done),
      [this, request](HostedJob& job) -> absl::StatusOr<v1::OffloadReply> {
        const at::Device target = request.to_host() ? at::Device(at::kCPU) : options_.device;
        const bool pin = request.to_host() && options_.device.is_cuda();
        const auto move = [&](at::Tensor tensor) {
          at::Tensor moved = tensor.to(target, /*non_blocking=*/false, /*copy=*/false);
          if (pin && !moved.is_pinned()) moved = moved.pin_memory();
          tensor.set_data(moved);
        };
        for (const std::string& role : request.roles()) {
          if (role == kActor && job.actor) {
            job.actor->ReleaseRollout();
            for (auto& [name, tensor] : job.actor->trained().StateTensors()) move(tensor);
          } else if (role == kCritic && job.critic) {
            for (auto& [name, tensor] : job.critic->trained().StateTensors()) move(tensor);
          } else if (role == kReference && job.reference) {
            for (at::Tensor& p : job.reference->module()->parameters()) move(p);
          } else if (role == kReward && job.reward_model) {
            for (at::Tensor& p : job.reward_model->module()->parameters()) move(p);
          } else {
            return absl::InvalidArgumentError(absl::StrCat(
                "offload: this worker hosts no ", SanitizeForDisplay(role, 40)));
          }
        }
        v1::OffloadReply reply;
        return reply;
      });
}

void RoleHost::DumpBatch(const v1::DumpBatchRequest& request, absl::Duration,
                         stages::StageDone<v1::DumpBatchReply> done) {
  RunStage<v1::DumpBatchReply>(
      request.key(), false, std::move(done),
      [request](HostedJob& job) -> absl::StatusOr<v1::DumpBatchReply> {
        RETURN_IF_ERROR(CheckConfiguredDirectory(request.directory(),
                                                 job.spec.trainer().rollout_data_dir(),
                                                 "trainer.rollout_data_dir"));
        const StepBatch& batch = job.batch;
        if (!batch.begun() || batch.step() != request.key().step()) {
          return absl::FailedPreconditionError(
              absl::StrCat("dump: this rank holds nothing of step ", request.key().step()));
        }
        RETURN_IF_ERROR(MakeDirectories(request.directory()));
        std::vector<std::pair<std::string, at::Tensor>> tensors(batch.tensors().begin(),
                                                                batch.tensors().end());
        const std::string path = absl::StrCat(request.directory(), "/step_", batch.step(),
                                              "_rank_", job.layout->rank(), ".safetensors");
        RETURN_IF_ERROR(model::WriteSafetensors(
            path, tensors,
            {{"format", "pt"},
             {"step", std::to_string(batch.step())},
             {"total_rows", std::to_string(batch.total_rows())},
             {"first_row", std::to_string(batch.rows().begin)},
             {"rows", std::to_string(batch.rows().size())},
             {"prompt_length", std::to_string(batch.prompt_length())},
             {"response_length", std::to_string(batch.response_length())}}));
        v1::DumpBatchReply reply;
        reply.set_path(path);
        return reply;
      });
}

void RoleHost::MeasurePrompts(const v1::MeasurePromptsRequest& request, absl::Duration,
                              stages::StageDone<v1::MeasurePromptsReply> done) {
  executor_.Post([this, request, done = std::move(done)] {
    logging::ScopedLogContext context({.job = request.key().job_id()});
    done(CatchAll<v1::MeasurePromptsReply>(
        "MeasurePrompts", [&]() -> absl::StatusOr<v1::MeasurePromptsReply> {
          const v1::ModelSpec& model = request.spec().model();
          const std::string dir = model.tokenizer_path().empty() ? model.path()
                                                                 : model.tokenizer_path();
          if (!measure_tokenizer_ || measure_tokenizer_dir_ != dir) {
            ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::Load(dir));
            measure_tokenizer_ = std::make_unique<model::Tokenizer>(std::move(tokenizer));
            measure_tokenizer_dir_ = dir;
          }
          // Measured whole: the limit is what is being checked.
          v1::DataSpec untruncated = request.spec().data();
          untruncated.set_max_prompt_length(std::numeric_limits<int32_t>::max());
          untruncated.set_truncation(v1::TRUNCATION_ERROR);
          v1::MeasurePromptsReply reply;
          for (int i = 0; i < request.prompts_size(); ++i) {
            ASSIGN_OR_RETURN(const EncodedPrompt encoded,
                             EncodePrompt(*measure_tokenizer_, request.prompts(i), untruncated,
                                          request.first_prompt() + i));
            reply.add_tokens(static_cast<int64_t>(encoded.ids.size()));
          }
          return reply;
        }));
  });
}

void RoleHost::EndJob(const v1::EndJobRequest& request, absl::Duration,
                      stages::StageDone<v1::EndJobReply> done) {
  if (absl::Status valid = CheckAttempt(request.attempt()); !valid.ok()) {
    done(valid);
    return;
  }
  {
    // The attempt's long waits (a remote reward) end now; a newer attempt's are not touched.
    std::lock_guard<std::mutex> lock(cancel_mutex_);
    const std::string prefix = request.job_id() + "#";
    for (auto& [key, flag] : cancel_flags_) {
      if (key.rfind(prefix, 0) != 0) continue;
      if (key == absl::StrCat(prefix, request.attempt())) flag->store(true);
    }
  }
  executor_.Post([this, request, done = std::move(done)] {
    done(CatchAll<v1::EndJobReply>("EndJob", [&]() -> absl::StatusOr<v1::EndJobReply> {
      const auto running = jobs_.find(request.job_id());
      if (running != jobs_.end() && running->second->attempt != request.attempt()) {
        return v1::EndJobReply();  // a newer attempt runs: not this call's to end
      }
      Forget(request.job_id());
      return v1::EndJobReply();
    }));
  });
}

void RoleHost::Forget(const std::string& job_id) {
  jobs_.erase(job_id);
  prepared_.erase(job_id);
  PublishHosted();
  std::lock_guard<std::mutex> lock(cancel_mutex_);
  for (auto it = cancel_flags_.begin(); it != cancel_flags_.end();) {
    it = it->first.rfind(job_id + "#", 0) == 0 ? cancel_flags_.erase(it) : ++it;
  }
}

void RoleHost::PublishHosted() {
  std::vector<v1::JobAttempt> hosted;
  const auto add = [&](const std::string& job_id, int64_t attempt) {
    v1::JobAttempt& entry = hosted.emplace_back();
    entry.set_job_id(job_id);
    entry.set_attempt(attempt);
  };
  for (const auto& [job_id, job] : jobs_) add(job_id, job->attempt);
  for (const auto& [job_id, prepared] : prepared_) {
    if (!jobs_.count(job_id)) add(job_id, prepared->attempt);
  }
  hosted_jobs_ = static_cast<int>(jobs_.size());
  std::lock_guard<std::mutex> lock(hosted_mutex_);
  hosted_attempts_ = std::move(hosted);
}

std::vector<v1::JobAttempt> RoleHost::HostedAttempts() const {
  std::lock_guard<std::mutex> lock(hosted_mutex_);
  return hosted_attempts_;
}

void RoleHost::EndMovedOn(std::vector<v1::JobAttempt> moved_on,
                          std::chrono::steady_clock::time_point asked_at) {
  if (moved_on.empty()) return;
  {
    // A stage of such an attempt may wait in a collective for peers that have moved on: it ends
    // now, not at the collective timeout. (The controller never runs that attempt here again.)
    std::lock_guard<std::mutex> lock(cancel_mutex_);
    for (const v1::JobAttempt& stale : moved_on) {
      const auto flag = cancel_flags_.find(absl::StrCat(stale.job_id(), "#", stale.attempt()));
      if (flag != cancel_flags_.end()) flag->second->store(true);
    }
  }
  executor_.Post([this, moved_on = std::move(moved_on), asked_at] {
    for (const v1::JobAttempt& stale : moved_on) {
      const auto job = jobs_.find(stale.job_id());
      const auto prepared = prepared_.find(stale.job_id());
      // Only the attempt the heartbeat listed, and only if it was here before that heartbeat: a
      // newer one that arrived since is the controller's current run.
      const bool listed_job = job != jobs_.end() && job->second->attempt == stale.attempt() &&
                              job->second->arrived < asked_at;
      const bool listed_rendezvous = job == jobs_.end() && prepared != prepared_.end() &&
                                     prepared->second->attempt == stale.attempt() &&
                                     prepared->second->arrived < asked_at;
      if (!listed_job && !listed_rendezvous) continue;
      RLOG(WARNING) << "job " << SanitizeForDisplay(stale.job_id(), 80) << " attempt "
                    << stale.attempt()
                    << ": the controller no longer runs it here (it moved the job on while this "
                       "worker was unreachable); ending it and freeing its memory";
      Forget(stale.job_id());
    }
  });
}

int64_t RoleHost::MemoryInUse() const {
#ifdef RLHFD_HAVE_CUDA
  if (options_.device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(options_.device.index())
        .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
        .current;
  }
#endif
  const struct mallinfo2 heap = ::mallinfo2();
  return static_cast<int64_t>(heap.uordblks + heap.hblkhd);
}

}  // namespace rlhfd::roles

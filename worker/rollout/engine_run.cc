// One Generate call's scheduling (GenerationEngine::Execute): the waiting queue, continuous
// batching over the cache slots, pipelined decode steps, and multi-turn samples. engine.cc holds
// the engine's lifecycle (cache, graphs, workspaces) and its checks.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <future>
#include <thread>

#include "common/util/stopwatch.h"
#include "worker/rollout/engine.h"
#include "worker/rollout/sampler.h"
#include "worker/rollout/sampling_math.h"

namespace rlhfd::rollout {

// One sample in flight.
struct GenerationEngine::Sequence {
  enum class State { kRunning, kFinished, kStopped };  // kStopped: its turn handler decides
  size_t request = 0;
  int64_t sample = 0;
  int64_t slot = 0;
  int64_t prompt_length = 0;
  uint64_t seed = 0;
  Completion completion;
  State state = State::kRunning;
  std::future<TurnOutcome> next_turn;  // kStopped, once the handler was told
};

// The state of one Generate call: the waiting queue, the running sequences and the free slots.
//
// Multi-turn (a TurnHandler): a sample that stops waits in paused_, keeping its slot, while its
// handler works out the next turn; when it goes on, its inserted tokens are appended and its
// whole context is prefilled again into the slot (simple and exact; a prefix cache would save
// the recomputation).
//
// Decode steps are pipelined: step k+1 is launched before the host reads step k's tokens, so the
// host's bookkeeping and the graph launch overlap the GPU's work. While the running set stays the
// same, each step's inputs (last token, position, sampling counter) are advanced on the device.
// A sequence that finished at step k has computed one more token in step k+1, which is dropped;
// when any finished (or new ones join), the host waits for the steps in flight, retires the
// finished and rebuilds the inputs.
class GenerationEngine::Run {
 public:
  Run(GenerationEngine& engine, const std::vector<GenerationRequest>& requests, TurnHandler* turns,
      const std::atomic<int64_t>* interrupt)
      : engine_(engine),
        requests_(requests),
        turns_(turns),
        interrupt_(interrupt),
        results_(requests.size()) {
    for (int64_t slot = engine.usable_slots_ - 1; slot >= 0; --slot) free_slots_.push_back(slot);
    for (size_t i = 0; i < requests.size(); ++i) {
      waiting_.push_back(i);
      results_[i].samples.resize(requests[i].sampling.n);
      const auto& seed = requests[i].sampling.seed;
      seeds_.push_back(seed ? *seed : engine.seed_sequence_());
    }
    eos_ = engine.options_.eos_token_ids;
    if (eos_.empty()) eos_ = engine.config_.eos_token_ids;
  }

  std::vector<GenerationResult> Execute() {
    const auto start = std::chrono::steady_clock::now();
    const double prefill_before = engine_.stats_.prefill_seconds;
    while (!waiting_.empty() || !running_.empty() || !paused_.empty()) {
      if (interrupt_ != nullptr && interrupt_->load() > 0) {
        Interrupt();
        break;
      }
      const bool turn_ready = AnyTurnReady();
      if (turn_ready || (!waiting_.empty() && (CanAdmit() || any_finished_))) {
        CollectAll();
        Retire();
        if (turn_ready) Resume();
        if (CanAdmit()) Prefill();
      }
      if (running_.empty()) {
        // Nothing to decode: the slots are held by samples waiting on their handlers (the
        // waiting prompts need them too). Wait for the first handler rather than spin.
        if (!paused_.empty()) paused_.front().next_turn.wait_for(std::chrono::milliseconds(5));
        continue;
      }
      LaunchDecode();
      if (in_flight_.size() > 1) CollectOldest();
    }
    // Decode time: all but the prefills (steps overlap, so they are not timed one by one).
    engine_.stats_.decode_seconds +=
        SecondsSince(start) - (engine_.stats_.prefill_seconds - prefill_before);
    return std::move(results_);
  }

 private:
  struct Step {
    int64_t rows;
    int buffer;  // Which pinned output buffer its tokens land in.
    std::unique_ptr<StreamMarker> done;
  };

  // Ends the call where it stands: the tokens in flight collected, and every sample not finished
  // returned as it is, interrupted (those not yet admitted with none).
  void Interrupt() {
    CollectAll();
    Retire();
    const auto interrupted = [this](Sequence& sequence) {
      sequence.completion.finish_reason = FinishReason::kInterrupted;
      Finish(std::move(sequence));
    };
    for (Sequence& sequence : running_) interrupted(sequence);
    for (Sequence& sequence : paused_) interrupted(sequence);
    running_.clear();
    paused_.clear();
    for (size_t request : waiting_) {
      for (rollout::Completion& sample : results_[request].samples) {
        sample = requests_[request].resumed.value_or(Completion());
        sample.finish_reason = FinishReason::kInterrupted;
      }
    }
    waiting_.clear();
  }

  bool CanAdmit() const {
    return !waiting_.empty() &&
           static_cast<int64_t>(free_slots_.size()) >= requests_[waiting_.front()].sampling.n;
  }

  // Admits waiting requests while slots are free and the padded prompt tokens fit the prefill
  // budget (one request always fits), prefills them together and draws each sample's first token.
  void Prefill() {
    const auto start = std::chrono::steady_clock::now();
    std::vector<size_t> admitted;
    int64_t longest = 0, reserved = 0;
    while (!waiting_.empty()) {
      const GenerationRequest& request = requests_[waiting_.front()];
      const int64_t n = request.sampling.n;
      const int64_t length = ContextLength(request);
      const int64_t padded = std::max(longest, length) * static_cast<int64_t>(admitted.size() + 1);
      if (static_cast<int64_t>(free_slots_.size()) - reserved < n) break;
      if (!admitted.empty() && padded > engine_.options_.max_prefill_tokens) break;
      admitted.push_back(waiting_.front());
      waiting_.pop_front();
      longest = std::max(longest, length);
      reserved += n;
    }
    if (admitted.empty()) return;  // No free slots: the running sequences decode first.

    const int64_t batch = static_cast<int64_t>(admitted.size());
    at::Tensor ids = at::zeros({batch, longest}, at::kLong);
    at::Tensor mask = at::zeros({batch, longest}, at::kLong);
    at::Tensor last_index = at::empty({batch}, at::kLong);
    int64_t* id_data = ids.data_ptr<int64_t>();
    int64_t* mask_data = mask.data_ptr<int64_t>();
    std::vector<int64_t> first_slots, sample_rows, copy_from, copy_to;
    size_t first_sequence = running_.size();
    bool ragged = false;
    for (int64_t b = 0; b < batch; ++b) {
      const size_t r = admitted[b];
      const GenerationRequest& request = requests_[r];
      const int64_t length = ContextLength(request);
      ragged |= length != longest;
      std::copy(request.prompt_ids.begin(), request.prompt_ids.end(), id_data + b * longest);
      if (request.resumed) {
        std::copy(request.resumed->token_ids.begin(), request.resumed->token_ids.end(),
                  id_data + b * longest + request.prompt_ids.size());
      }
      std::fill_n(mask_data + b * longest, length, 1);
      last_index.data_ptr<int64_t>()[b] = length - 1;
      for (int64_t j = 0; j < request.sampling.n; ++j) {
        Sequence sequence;
        sequence.request = r;
        sequence.sample = j;
        sequence.slot = free_slots_.back();
        free_slots_.pop_back();
        sequence.prompt_length = static_cast<int64_t>(request.prompt_ids.size());
        if (request.resumed) {
          sequence.seed = seeds_[r];  // the sample's own
          sequence.completion = *request.resumed;
        } else {
          sequence.seed = SampleSeed(seeds_[r], static_cast<uint64_t>(j));
        }
        if (j == 0) {
          first_slots.push_back(sequence.slot);
        } else {
          copy_from.push_back(first_slots.back());
          copy_to.push_back(sequence.slot);
        }
        sample_rows.push_back(b);
        running_.push_back(std::move(sequence));
      }
    }
    const at::Tensor logits = PrefillForward(ids, mask, last_index, first_slots, ragged);
    if (!copy_to.empty()) {
      engine_.cache_->CopyPrefix(OnDevice(copy_from), OnDevice(copy_to), longest);
    }
    // Every sample's first token, drawn now (the host needs them before any decode step).
    DrawFirst(logits.index_select(0, OnDevice(sample_rows)), first_sequence);

    engine_.stats_.prompts += batch;
    engine_.stats_.prefill_tokens += std::count(mask_data, mask_data + batch * longest, 1);
    engine_.stats_.prefill_seconds += SecondsSince(start);
  }

  at::Tensor OnDevice(const std::vector<int64_t>& values) const {
    return at::tensor(values, at::kLong).to(engine_.device_);
  }

  // Prefills `ids` (B, T; row b's tokens where `mask` is 1, `last_index` its last) into cache
  // slots `slots` from position 0; the logits after each row's last token, (B, V).
  at::Tensor PrefillForward(const at::Tensor& ids, const at::Tensor& mask,
                            const at::Tensor& last_index, const std::vector<int64_t>& slots,
                            bool ragged) {
    const at::Device device = engine_.device_;
    SlotKvCache& cache = *engine_.cache_;
    if (engine_.fused_) {
      const at::Tensor logits =
          engine_.fused_->Prefill(ids.to(device), (last_index + 1).to(device), OnDevice(slots),
                                  engine_.usable_slots_, cache);
      // Tensor-parallel: what follows copies from the host, which waits for the stream; the
      // prefill's collectives are waited for first, within the communicator's timeout.
      AwaitGroup();
      return logits;
    }
    cache.BeginPrefill(OnDevice(slots));
    model::ForwardBatch forward{ids.to(device), ragged ? mask.to(device) : at::Tensor()};
    const at::Tensor hidden = engine_.model_->Hidden(forward, &cache);  // (B, T, C)
    const at::Tensor last = hidden.index(
        {at::arange(ids.size(0), hidden.options().dtype(at::kLong)), last_index.to(device)});
    return engine_.model_->Logits(last.unsqueeze(1)).squeeze(1);
  }

  // Draws the next token of running_[first, first + rows) from `logits` (rows, V), at once: the
  // host needs them before any decode step.
  void DrawFirst(const at::Tensor& logits, size_t first) {
    const int64_t rows = logits.size(0);
    UploadSamplingRows(first, rows);
    const SampledTokens drawn = SampleTokens(logits, DeviceSamplingRows(rows));
    const int buffer = CopyToHost(drawn, rows);
    AwaitGroup();
    Synchronize(engine_.device_);
    Append(first, rows, buffer);
    device_inputs_valid_ = false;
  }

  bool AnyTurnReady() const {
    for (const Sequence& sequence : paused_) {
      if (sequence.next_turn.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        return true;
      }
    }
    return false;
  }

  // The samples whose handlers have decided: finished, or their inserted tokens appended and
  // their whole context prefilled again into their slots (batches within the prefill budget),
  // each drawing its next token. No step may be in flight.
  void Resume() {
    std::vector<Sequence> still_paused, going_on;
    for (Sequence& sequence : paused_) {
      if (sequence.next_turn.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        still_paused.push_back(std::move(sequence));
        continue;
      }
      TurnOutcome outcome;
      try {
        outcome = sequence.next_turn.get();
      } catch (...) {
        outcome = TurnOutcome{};  // A handler that failed ends its sample, as it stands.
      }
      const int64_t budget = requests_[sequence.request].sampling.max_new_tokens;
      Completion& completion = sequence.completion;
      const int64_t room = budget - static_cast<int64_t>(completion.token_ids.size());
      if (outcome.finish || outcome.inserted.empty()) {
        Finish(std::move(sequence));
        continue;
      }
      const int64_t taken = std::min<int64_t>(room, outcome.inserted.size());
      completion.token_ids.insert(completion.token_ids.end(), outcome.inserted.begin(),
                                  outcome.inserted.begin() + taken);
      completion.logprobs.insert(completion.logprobs.end(), taken, 0.f);
      completion.response_mask.insert(completion.response_mask.end(), taken, 0);
      if (taken == room) {  // No room left to sample: cut at the length limit.
        completion.finish_reason = FinishReason::kLength;
        Finish(std::move(sequence));
        continue;
      }
      sequence.state = Sequence::State::kRunning;
      going_on.push_back(std::move(sequence));
    }
    paused_ = std::move(still_paused);
    for (size_t begin = 0; begin < going_on.size();) {
      const auto start = std::chrono::steady_clock::now();
      // As many as fit the prefill budget, padded to the longest (one always fits).
      size_t end = begin;
      int64_t longest = 0;
      while (end < going_on.size()) {
        const int64_t length = ContextLength(going_on[end]);
        const int64_t padded = std::max(longest, length) * static_cast<int64_t>(end - begin + 1);
        if (end > begin && padded > engine_.options_.max_prefill_tokens) break;
        longest = std::max(longest, length);
        ++end;
      }
      const int64_t batch = static_cast<int64_t>(end - begin);
      at::Tensor ids = at::zeros({batch, longest}, at::kLong);
      at::Tensor mask = at::zeros({batch, longest}, at::kLong);
      at::Tensor last_index = at::empty({batch}, at::kLong);
      std::vector<int64_t> slots;
      bool ragged = false;
      int64_t tokens = 0;
      for (int64_t b = 0; b < batch; ++b) {
        const Sequence& sequence = going_on[begin + b];
        const std::vector<int64_t>& prompt = requests_[sequence.request].prompt_ids;
        const std::vector<int64_t>& response = sequence.completion.token_ids;
        int64_t* row = ids.data_ptr<int64_t>() + b * longest;
        std::copy(prompt.begin(), prompt.end(), row);
        std::copy(response.begin(), response.end(), row + prompt.size());
        const int64_t length = ContextLength(sequence);
        std::fill_n(mask.data_ptr<int64_t>() + b * longest, length, 1);
        last_index.data_ptr<int64_t>()[b] = length - 1;
        ragged |= length != longest;
        tokens += length;
        slots.push_back(sequence.slot);
      }
      const at::Tensor logits = PrefillForward(ids, mask, last_index, slots, ragged);
      const size_t first = running_.size();
      for (size_t i = begin; i < end; ++i) running_.push_back(std::move(going_on[i]));
      DrawFirst(logits, first);
      engine_.stats_.resumed_turns += batch;
      engine_.stats_.prefill_tokens += tokens;
      engine_.stats_.prefill_seconds += SecondsSince(start);
      begin = end;
    }
  }

  static int64_t ContextLength(const GenerationRequest& request) {
    return static_cast<int64_t>(request.prompt_ids.size() +
                                (request.resumed ? request.resumed->token_ids.size() : 0));
  }
  static int64_t ContextLength(const Sequence& sequence) {
    return sequence.prompt_length + static_cast<int64_t>(sequence.completion.token_ids.size());
  }

  // Moves a sample to the results and frees its slot.
  void Finish(Sequence sequence) {
    free_slots_.push_back(sequence.slot);
    results_[sequence.request].samples[sequence.sample] = std::move(sequence.completion);
  }

  // Launches one decode step over every running sequence. Inputs come from the device when the
  // running set is unchanged since the last step, else from the host (after collecting).
  void LaunchDecode() {
    if (engine_.options_.decode_step_hold.count() > 0) {
      std::this_thread::sleep_for(engine_.options_.decode_step_hold);
    }
    if (any_finished_ || !device_inputs_valid_) {
      CollectAll();
      Retire();
      if (running_.empty()) return;
      UploadStepInputs();
      UploadSamplingRows(0, static_cast<int64_t>(running_.size()));
      device_inputs_valid_ = true;
    }
    const int64_t rows = static_cast<int64_t>(running_.size());
    const int64_t bucket = engine_.graphs_.empty() ? rows : engine_.graphs_.BucketFor(rows);
    const at::Tensor logits =
        engine_.graphs_.empty() ? engine_.DecodeForward(bucket) : engine_.graphs_.Replay(bucket);
    const SampledTokens drawn = SampleTokens(logits.narrow(0, 0, rows), DeviceSamplingRows(rows));
    // The next step's inputs, advanced on the device: this token, one position on, next counter.
    engine_.step_inputs_[0].narrow(0, 0, rows).copy_(drawn.tokens);
    engine_.step_inputs_[1].narrow(0, 0, rows).add_(1);
    engine_.device_ints_[1].narrow(0, 0, rows).add_(1);
    const int buffer = CopyToHost(drawn, rows);
    in_flight_.push_back({rows, buffer, std::make_unique<StreamMarker>(engine_.device_)});
    engine_.stats_.decode_steps += 1;
  }

  // Tensor-parallel: waits for the group's queued collectives within the communicator's timeout
  // (a peer that died fails here, as an error, rather than leaving a host wait on the stream
  // hanging).
  void AwaitGroup() {
    if (engine_.group_ == nullptr) return;
    const absl::Status status = engine_.group_->Synchronize();
    TORCH_CHECK(status.ok(),
                "tensor-parallel decode: waiting for the group: ", std::string(status.message()));
  }

  void CollectOldest() {
    Step step = std::move(in_flight_.front());
    in_flight_.pop_front();
    // Tensor-parallel: a step slow to finish may be waiting on a peer that is gone; the group's
    // own wait tells, within its timeout (it waits for the step after this one too, so only then).
    if (engine_.group_ != nullptr && !step.done->WaitFor(std::chrono::seconds(1))) AwaitGroup();
    step.done->Wait();
    Append(0, step.rows, step.buffer);
  }

  void CollectAll() {
    while (!in_flight_.empty()) CollectOldest();
  }

  // Decode inputs of running_ (token, position, slot per row) into step_inputs_. Rows past
  // running_ (graph padding) decode a dummy token into the scratch slot.
  void UploadStepInputs() {
    const int64_t rows = static_cast<int64_t>(running_.size()), slots = engine_.usable_slots_;
    int64_t* token = engine_.host_inputs_.data_ptr<int64_t>();
    int64_t* position = token + slots;
    int64_t* slot = position + slots;
    std::fill_n(token + rows, slots - rows, 0);
    std::fill_n(position + rows, slots - rows, 0);
    std::fill_n(slot + rows, slots - rows, slots);
    for (int64_t i = 0; i < rows; ++i) {
      const Sequence& sequence = running_[i];
      const int64_t generated = static_cast<int64_t>(sequence.completion.token_ids.size());
      token[i] = sequence.completion.token_ids.back();
      position[i] = sequence.prompt_length + generated - 1;
      slot[i] = sequence.slot;
    }
    engine_.step_inputs_.copy_(engine_.host_inputs_, /*non_blocking=*/true);
  }

  // Sampling parameters of running_[first, first + rows) into rows [0, rows) of the device
  // buffers: seed, counter (the next token's index), top-k / temperature, top-p.
  void UploadSamplingRows(size_t first, int64_t rows) {
    const int64_t slots = engine_.usable_slots_;
    int64_t* seed = engine_.host_ints_.data_ptr<int64_t>();
    int64_t* counter = seed + slots;
    int64_t* top_k = counter + slots;
    float* temperature = engine_.host_floats_.data_ptr<float>();
    float* top_p = temperature + slots;
    filtered_ = false;
    for (int64_t i = 0; i < rows; ++i) {
      const Sequence& sequence = running_[first + i];
      const SamplingParams& sampling = requests_[sequence.request].sampling;
      seed[i] = static_cast<int64_t>(sequence.seed);
      counter[i] = static_cast<int64_t>(sequence.completion.token_ids.size());
      top_k[i] = sampling.top_k;
      temperature[i] = static_cast<float>(sampling.temperature);
      top_p[i] = static_cast<float>(sampling.top_p);
      filtered_ |= sampling.top_k > 0 || sampling.top_p < 1.0;
    }
    engine_.device_ints_.copy_(engine_.host_ints_, /*non_blocking=*/true);
    engine_.device_floats_.copy_(engine_.host_floats_, /*non_blocking=*/true);
  }

  SamplingRows DeviceSamplingRows(int64_t rows) const {
    const auto view = [rows](const at::Tensor& buffer, int64_t index) {
      return buffer[index].narrow(0, 0, rows);
    };
    SamplingRows parameters{view(engine_.device_floats_, 0), view(engine_.device_ints_, 0),
                            view(engine_.device_ints_, 1)};
    if (filtered_) {
      parameters.top_k = view(engine_.device_ints_, 2);
      parameters.top_p = view(engine_.device_floats_, 1);
    }
    return parameters;
  }

  // Starts copying drawn tokens and log-probs to the next pinned output buffer; returns it.
  int CopyToHost(const SampledTokens& drawn, int64_t rows) {
    const int buffer = next_buffer_;
    next_buffer_ = 1 - next_buffer_;
    engine_.host_tokens_[buffer].narrow(0, 0, rows).copy_(drawn.tokens, /*non_blocking=*/true);
    engine_.host_logprobs_[buffer].narrow(0, 0, rows).copy_(drawn.logprobs, /*non_blocking=*/true);
    return buffer;
  }

  // Appends the tokens of output `buffer` to running_[first, first + rows), skipping sequences
  // already stopped, and marks those that stop now: finished, or (a stop with a turn handler)
  // waiting on it.
  void Append(size_t first, int64_t rows, int buffer) {
    const int64_t* token = engine_.host_tokens_[buffer].data_ptr<int64_t>();
    const float* logprob = engine_.host_logprobs_[buffer].data_ptr<float>();
    for (int64_t i = 0; i < rows; ++i) {
      Sequence& sequence = running_[first + i];
      // A token past the end, computed by the pipeline.
      if (sequence.state != Sequence::State::kRunning) continue;
      const SamplingParams& sampling = requests_[sequence.request].sampling;
      sequence.completion.token_ids.push_back(token[i]);
      sequence.completion.logprobs.push_back(logprob[i]);
      sequence.completion.response_mask.push_back(1);
      engine_.stats_.generated_tokens += 1;
      const std::optional<FinishReason> finish = FinishWith(
          sampling, eos_, token[i], static_cast<int64_t>(sequence.completion.token_ids.size()));
      if (!finish) continue;
      sequence.completion.finish_reason = *finish;
      sequence.state = turns_ != nullptr && *finish == FinishReason::kStop
                           ? Sequence::State::kStopped
                           : Sequence::State::kFinished;
      any_finished_ = true;
    }
  }

  // Moves finished sequences to the results (freeing their slots) and stopped ones, their
  // handlers told, to paused_ (keeping them). No step may be in flight.
  void Retire() {
    if (!any_finished_) return;
    std::vector<Sequence> still_running;
    still_running.reserve(running_.size());
    for (Sequence& sequence : running_) {
      switch (sequence.state) {
        case Sequence::State::kRunning:
          still_running.push_back(std::move(sequence));
          break;
        case Sequence::State::kFinished:
          Finish(std::move(sequence));
          break;
        case Sequence::State::kStopped:
          sequence.next_turn =
              turns_->OnStop(sequence.request, sequence.sample, sequence.completion);
          paused_.push_back(std::move(sequence));
          break;
      }
    }
    running_ = std::move(still_running);
    any_finished_ = false;
    device_inputs_valid_ = false;
  }

  GenerationEngine& engine_;
  const std::vector<GenerationRequest>& requests_;
  TurnHandler* turns_;  // null: every stop finishes its sample
  const std::atomic<int64_t>* interrupt_;  // null: never interrupted
  std::vector<GenerationResult> results_;
  std::vector<uint64_t> seeds_;
  std::vector<int64_t> eos_;
  std::deque<size_t> waiting_;
  std::vector<Sequence> running_;
  std::vector<Sequence> paused_;  // stopped, waiting on their turn handlers; slots kept
  std::vector<int64_t> free_slots_;
  std::deque<Step> in_flight_;
  bool any_finished_ = false;
  bool device_inputs_valid_ = false;  // step_inputs_ and the sampling rows match running_.
  bool filtered_ = false;             // Some row of the uploaded sampling rows uses top-k / top-p.
  int next_buffer_ = 0;
};

std::vector<GenerationResult> GenerationEngine::Execute(
    const std::vector<GenerationRequest>& requests, TurnHandler* turns,
    const std::atomic<int64_t>* interrupt) {
  Run run(*this, requests, turns, interrupt);
  return run.Execute();
}

}  // namespace rlhfd::rollout

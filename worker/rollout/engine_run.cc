// One Generate call's scheduling (GenerationEngine::Execute): the waiting queue, admission and
// prefills over the paged cache's blocks (prefix cache included), the call's loop, multi-turn
// samples. engine_step.cc holds the decode steps; engine.cc the engine's lifecycle (cache,
// graphs, workspaces) and its checks.
#include "worker/rollout/engine_run.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "common/util/stopwatch.h"
#include "worker/rollout/sampling_math.h"

namespace rlhfd::rollout {

std::vector<GenerationResult> GenerationEngine::Run::Execute() {
  const auto start = std::chrono::steady_clock::now();
  const double prefill_before = engine_.stats_.prefill_seconds;
  while (Pending() || !running_.empty() || !paused_.empty()) {
    if (interrupt_ != nullptr && interrupt_->load() > 0) {
      Interrupt();
      break;
    }
    const bool turn_ready = AnyTurnReady();
    if (turn_ready || (Pending() && (CanAdmit() || any_finished_))) {
      CollectAll();
      Retire();
      if (turn_ready) Resume();
      if (CanAdmit()) Prefill();
    }
    if (running_.empty()) {
      // Nothing to decode: the samples are waiting on their handlers. Wait for the first
      // handler rather than spin.
      if (!paused_.empty()) {
        paused_.front().next_turn.wait_for(std::chrono::milliseconds(5));
      } else {
        // With nothing running every block is free, and one sequence always fits.
        TORCH_CHECK(!Pending(), "generation: nothing runs and the next sequence cannot start");
      }
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

GenerationEngine::Run::Admission GenerationEngine::Run::Next() const {
  if (!requeued_.empty()) {
    const int64_t context = ContextLength(requeued_.front());
    return {context, 1, pool_.BlocksFor(context)};
  }
  const GenerationRequest& request = requests_[waiting_.front()];
  const int64_t context = ContextLength(request), n = request.sampling.n;
  // The first sample holds the prompt's blocks, its siblings share the full ones and copy a
  // partly filled last one.
  const int64_t partial = context % pool_.block_size() != 0 ? 1 : 0;
  return {context, n, pool_.BlocksFor(context) + (n - 1) * partial};
}

bool GenerationEngine::Run::Fits(const Admission& next, int64_t rows, int64_t reserved) const {
  if (rows + next.samples > rows_) return false;
  const int64_t room = pool_.free_blocks() - reserved;
  return next.blocks + (rows == 0 ? 0 : next.samples) <= room;
}

bool GenerationEngine::Run::CanAdmit() const {
  return Pending() && Fits(Next(), static_cast<int64_t>(running_.size()), 0);
}

void GenerationEngine::Run::Interrupt() {
  CollectAll();
  Retire();
  const auto interrupted = [this](Sequence& sequence) {
    sequence.completion.finish_reason = FinishReason::kInterrupted;
    Finish(std::move(sequence));
  };
  for (Sequence& sequence : running_) interrupted(sequence);
  for (Sequence& sequence : paused_) interrupted(sequence);
  for (Sequence& sequence : requeued_) interrupted(sequence);
  running_.clear();
  paused_.clear();
  requeued_.clear();
  for (size_t request : waiting_) {
    for (rollout::Completion& sample : results_[request].samples) {
      sample = requests_[request].resumed.value_or(Completion());
      sample.finish_reason = FinishReason::kInterrupted;
    }
  }
  waiting_.clear();
}

void GenerationEngine::Run::Prefill() {
  const auto start = std::chrono::steady_clock::now();
  // Per prefill row: its sequences (in running_ from `first_sequence` on, in row order).
  std::vector<int64_t> row_samples;
  int64_t longest = 0, rows = static_cast<int64_t>(running_.size()), reserved = 0;
  const size_t first_sequence = running_.size();
  int64_t new_prompts = 0;
  while (Pending()) {
    const Admission next = Next();
    const int64_t padded =
        std::max(longest, next.context) * static_cast<int64_t>(row_samples.size() + 1);
    if (!Fits(next, rows, reserved)) break;
    if (!row_samples.empty() && padded > engine_.options_.max_prefill_tokens) break;
    if (!requeued_.empty()) {
      running_.push_back(std::move(requeued_.front()));
      requeued_.pop_front();
    } else {
      AdmitRequest(waiting_.front());
      waiting_.pop_front();
      ++new_prompts;
    }
    row_samples.push_back(next.samples);
    longest = std::max(longest, next.context);
    rows += next.samples;
    reserved += next.blocks + next.samples;  // Its blocks and each sample's next one.
  }
  if (row_samples.empty()) return;

  // Each row's first sample takes its context's blocks: those of a cached prefix (whole blocks,
  // short of the last token, whose logits are needed), then new ones for the rest; its
  // siblings share the whole ones and copy a partly filled last one.
  const int64_t batch = static_cast<int64_t>(row_samples.size());
  std::vector<std::vector<int64_t>> contexts(batch);
  std::vector<PrefillRow> prefill_rows(batch);
  std::vector<int64_t> sample_rows, copy_from, copy_to;
  int64_t cached_tokens = 0;
  for (int64_t b = 0, index = first_sequence; b < batch; ++b) {
    Sequence& first = running_[index];
    contexts[b] = Context(first);
    const int64_t cached = pool_.TakeContext(contexts[b], first.blocks);
    prefill_rows[b] = {contexts[b], cached, first.blocks};
    cached_tokens += cached;
    for (int64_t j = 0; j < row_samples[b]; ++j, ++index) {
      sample_rows.push_back(b);
      if (j == 0) continue;
      const int64_t length = static_cast<int64_t>(contexts[b].size());
      if (const auto copy = pool_.ShareContext(first.blocks, length, running_[index].blocks)) {
        copy_from.push_back(copy->first);
        copy_to.push_back(copy->second);
      }
    }
  }
  const PrefillInputs inputs = MakePrefillInputs(
      prefill_rows, pool_.block_size(), engine_.cache_->scratch_block(), engine_.max_blocks_);
  NoteBlocksHeld();
  const at::Tensor logits = PrefillForward(inputs);
  if (!copy_to.empty()) engine_.cache_->CopyBlocks(OnDevice(copy_from), OnDevice(copy_to));
  // The prompts' whole blocks are written now: cached for later sequences.
  for (int64_t b = 0, index = first_sequence; b < batch; index += row_samples[b], ++b) {
    pool_.RegisterWritten(contexts[b], running_[index].blocks,
                          static_cast<int64_t>(contexts[b].size()));
  }
  // Every sample's next token, drawn now (the host needs them before any decode step).
  DrawFirst(logits.index_select(0, OnDevice(sample_rows)), first_sequence);

  engine_.stats_.prompts += new_prompts;
  engine_.stats_.prefill_tokens += inputs.tokens;
  engine_.stats_.cached_prefix_tokens += cached_tokens;
  engine_.stats_.prefill_seconds += SecondsSince(start);
}

std::vector<int64_t> GenerationEngine::Run::Context(const Sequence& sequence) const {
  std::vector<int64_t> context = requests_[sequence.request].prompt_ids;
  context.insert(context.end(), sequence.completion.token_ids.begin(),
                 sequence.completion.token_ids.end());
  return context;
}

void GenerationEngine::Run::AdmitRequest(size_t r) {
  const GenerationRequest& request = requests_[r];
  for (int64_t j = 0; j < request.sampling.n; ++j) {
    Sequence sequence;
    sequence.request = r;
    sequence.sample = j;
    sequence.prompt_length = static_cast<int64_t>(request.prompt_ids.size());
    if (request.resumed) {
      sequence.seed = seeds_[r];  // the sample's own
      sequence.completion = *request.resumed;
    } else {
      sequence.seed = SampleSeed(seeds_[r], static_cast<uint64_t>(j));
    }
    running_.push_back(std::move(sequence));
  }
}

at::Tensor GenerationEngine::Run::OnDevice(const std::vector<int64_t>& values) const {
  return at::tensor(values, at::kLong).to(engine_.device_);
}

at::Tensor GenerationEngine::Run::PrefillForward(const PrefillInputs& inputs) {
  const at::Device device = engine_.device_;
  std::optional<PrefillPast> past = inputs.past;
  if (past) {
    for (at::Tensor* part : {&past->block_tables, &past->positions, &past->lengths}) {
      *part = part->to(device);
    }
  }
  const at::Tensor ids = inputs.ids.to(device), cache_rows = inputs.cache_rows.to(device);
  PagedKvCache& cache = *engine_.cache_;
  if (engine_.fused_) {
    const at::Tensor logits =
        engine_.fused_->Prefill(ids, (inputs.last_index + 1).to(device), cache_rows, past, cache);
    // Tensor-parallel: what follows copies from the host, which waits for the stream; the
    // prefill's collectives are waited for first, within the communicator's timeout.
    AwaitGroup();
    return logits;
  }
  cache.BeginPrefill(cache_rows, past);
  model::ForwardBatch forward{ids, inputs.ragged ? inputs.mask.to(device) : at::Tensor(),
                              past ? past->positions : at::Tensor()};
  const at::Tensor hidden = engine_.model_->Hidden(forward, &cache);  // (B, T, C)
  const at::Tensor last = hidden.index(
      {at::arange(ids.size(0), hidden.options().dtype(at::kLong)), inputs.last_index.to(device)});
  return engine_.model_->Logits(last.unsqueeze(1)).squeeze(1);
}

void GenerationEngine::Run::DrawFirst(const at::Tensor& logits, size_t first) {
  const int64_t rows = logits.size(0);
  UploadSamplingRows(first, rows);
  const SampledTokens drawn = SampleTokens(logits, DeviceSamplingRows(rows));
  const int buffer = CopyToHost(drawn, rows);
  AwaitGroup();
  Synchronize(engine_.device_);
  Append(first, rows, buffer);
  device_inputs_valid_ = false;
}

bool GenerationEngine::Run::AnyTurnReady() const {
  for (const Sequence& sequence : paused_) {
    if (sequence.next_turn.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      return true;
    }
  }
  return false;
}

void GenerationEngine::Run::Resume() {
  std::vector<Sequence> still_paused;
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
    requeued_.push_back(std::move(sequence));
    engine_.stats_.resumed_turns += 1;
  }
  paused_ = std::move(still_paused);
}

void GenerationEngine::Run::ReleaseBlocks(Sequence& sequence) {
  if (sequence.blocks.empty()) return;
  pool_.ReleaseContext(Context(sequence), sequence.blocks, ContextLength(sequence) - 1);
}

void GenerationEngine::Run::Finish(Sequence sequence) {
  ReleaseBlocks(sequence);
  results_[sequence.request].samples[sequence.sample] = std::move(sequence.completion);
}

std::vector<GenerationResult> GenerationEngine::Execute(
    const std::vector<GenerationRequest>& requests, TurnHandler* turns,
    const std::atomic<int64_t>* interrupt) {
  Run run(*this, requests, turns, interrupt);
  return run.Execute();
}

}  // namespace rlhfd::rollout

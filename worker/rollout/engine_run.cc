// One Generate call's scheduling (GenerationEngine::Execute): the waiting queue, continuous
// batching over the paged cache's blocks with preemption, pipelined decode steps, and multi-turn
// samples. engine.cc holds the engine's lifecycle (cache, graphs, workspaces) and its checks.
#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <future>
#include <optional>
#include <span>
#include <thread>

#include "common/util/stopwatch.h"
#include "worker/rollout/block_pool.h"
#include "worker/rollout/engine.h"
#include "worker/rollout/prefill_inputs.h"
#include "worker/rollout/sampler.h"
#include "worker/rollout/sampling_math.h"

namespace rlhfd::rollout {

// One sample in flight.
struct GenerationEngine::Sequence {
  enum class State { kRunning, kFinished, kStopped };  // kStopped: its turn handler decides
  size_t request = 0;
  int64_t sample = 0;
  std::vector<int64_t> blocks;  // Its KV cache blocks, in position order (none while waiting).
  int64_t prompt_length = 0;
  int64_t next_position = 0;  // Where the next decode step launched for it writes.
  uint64_t seed = 0;
  Completion completion;
  State state = State::kRunning;
  std::future<TurnOutcome> next_turn;  // kStopped, once the handler was told
};

// The state of one Generate call: the waiting queue, the running sequences and the cache's blocks.
//
// Paged KV cache: a sequence holds the blocks its positions fill and takes another when a decode
// step crosses into it. Admission takes a prompt's blocks (the n samples of a prompt hold its full
// blocks together; each gets its own copy of a partly filled last block) and, beside other
// sequences, only while a block per new sample stays free to grow into. When a step needs more
// blocks than are free, the sequences admitted last give theirs up (preemption, as vLLM's
// recompute): they wait in requeued_ with their tokens so far, and are prefilled again, ahead of
// new prompts, once blocks are free. The oldest sequence can always go on (one sequence of
// max_model_len fits the cache), so the call ends. Sampling is keyed by (seed, token index), so a
// resumed sequence draws what it would have.
//
// Multi-turn (a TurnHandler): a sample that stops gives its blocks up (to the prefix cache) and
// waits in paused_ while its handler works out the next turn; when it goes on, its inserted
// tokens are appended and it waits in requeued_ to be prefilled again from its cached blocks on.
//
// Decode steps are pipelined: step k+1 is launched before the host reads step k's tokens, so the
// host's bookkeeping and the graph launch overlap the GPU's work. While the running set stays the
// same, each step's inputs (last token, position, sampling counter) are advanced on the device,
// and a block a sequence crosses into is written into its block table by a small update. A
// sequence that finished at step k has computed one more token in step k+1, which is dropped;
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
        results_(requests.size()),
        pool_(engine.cache_->blocks() - 1,  // Without the scratch block.
              engine.cache_->block_size(), engine.options_.enable_prefix_caching),
        rows_(engine.options_.max_num_seqs) {
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

 private:
  struct Step {
    int64_t rows;
    int buffer;  // Which pinned output buffer its tokens land in.
    std::unique_ptr<StreamMarker> done;
  };

  // What a prefill admits: a waiting request's n samples, or one requeued sequence.
  struct Admission {
    int64_t context = 0;  // Tokens to prefill.
    int64_t samples = 0;
    int64_t blocks = 0;  // Blocks they take at once.
  };

  bool Pending() const { return !waiting_.empty() || !requeued_.empty(); }

  // The next admission: a requeued sequence first (they were admitted before), else the next
  // waiting request.
  Admission Next() const {
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

  // Whether `next` fits beside `rows` running rows and the `reserved` blocks of this prefill's
  // earlier admissions: a row per sample, and its blocks with one more per sample to grow into,
  // unless nothing else runs (then its own samples make room for each other by preemption).
  bool Fits(const Admission& next, int64_t rows, int64_t reserved) const {
    if (rows + next.samples > rows_) return false;
    const int64_t room = pool_.free_blocks() - reserved;
    return next.blocks + (rows == 0 ? 0 : next.samples) <= room;
  }

  bool CanAdmit() const {
    return Pending() && Fits(Next(), static_cast<int64_t>(running_.size()), 0);
  }

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

  // Admits requeued sequences, then waiting requests, while rows and blocks allow and the padded
  // prompt tokens fit the prefill budget (one always fits), prefills them together and draws each
  // sample's next token. No step may be in flight.
  void Prefill() {
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

  // A sequence's context: its prompt, then its tokens so far.
  std::vector<int64_t> Context(const Sequence& sequence) const {
    std::vector<int64_t> context = requests_[sequence.request].prompt_ids;
    context.insert(context.end(), sequence.completion.token_ids.begin(),
                   sequence.completion.token_ids.end());
    return context;
  }

  // The n samples of waiting request `r`, appended to running_ (their blocks are Prefill's).
  void AdmitRequest(size_t r) {
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

  at::Tensor OnDevice(const std::vector<int64_t>& values) const {
    return at::tensor(values, at::kLong).to(engine_.device_);
  }

  // Prefills `inputs`; the logits after each row's last token, (B, V).
  at::Tensor PrefillForward(const PrefillInputs& inputs) {
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
  // their whole context queued to be prefilled again (requeued_), then drawing its next token.
  void Resume() {
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

  static int64_t ContextLength(const GenerationRequest& request) {
    return static_cast<int64_t>(request.prompt_ids.size() +
                                (request.resumed ? request.resumed->token_ids.size() : 0));
  }
  static int64_t ContextLength(const Sequence& sequence) {
    return sequence.prompt_length + static_cast<int64_t>(sequence.completion.token_ids.size());
  }

  // Lets a sequence's blocks go, those whose keys and values are all written (all but its last
  // token's) kept in the prefix cache, so that it finds them when it comes back.
  void ReleaseBlocks(Sequence& sequence) {
    if (sequence.blocks.empty()) return;
    pool_.ReleaseContext(Context(sequence), sequence.blocks, ContextLength(sequence) - 1);
  }

  // Moves a sample to the results and frees its blocks.
  void Finish(Sequence sequence) {
    ReleaseBlocks(sequence);
    results_[sequence.request].samples[sequence.sample] = std::move(sequence.completion);
  }

  // Launches one decode step over every running sequence. Inputs come from the device when the
  // running set is unchanged since the last step, else from the host (after collecting). Each
  // sequence first gets the block its position needs; when too few are free the sequences
  // admitted last are preempted.
  void LaunchDecode() {
    if (engine_.options_.decode_step_hold.count() > 0) {
      std::this_thread::sleep_for(engine_.options_.decode_step_hold);
    }
    bool rebuild = any_finished_ || !device_inputs_valid_;
    if (rebuild && !Settle()) return;
    if (!TakeStepBlocks()) {
      if (!rebuild && !Settle()) return;
      rebuild = true;
      Preempt();
      if (running_.empty()) return;
      TORCH_CHECK(TakeStepBlocks(), "generation: no block for the oldest sequence");
    }
    if (rebuild) {
      UploadStepInputs();
      UploadSamplingRows(0, static_cast<int64_t>(running_.size()));
      device_inputs_valid_ = true;
    } else {
      UploadTableUpdates();
    }
    const int64_t rows = static_cast<int64_t>(running_.size());
    engine_.stats_.peak_running = std::max(engine_.stats_.peak_running, rows);
    const int64_t bucket = engine_.graphs_.empty() ? rows : engine_.graphs_.BucketFor(rows);
    const at::Tensor logits =
        engine_.graphs_.empty() ? engine_.DecodeForward(bucket) : engine_.graphs_.Replay(bucket);
    const SampledTokens drawn = SampleTokens(logits.narrow(0, 0, rows), DeviceSamplingRows(rows));
    // The next step's inputs, advanced on the device: this token, one position on, next counter.
    engine_.step_inputs_[0].narrow(0, 0, rows).copy_(drawn.tokens);
    engine_.step_inputs_[1].narrow(0, 0, rows).add_(1);
    engine_.device_ints_[1].narrow(0, 0, rows).add_(1);
    for (Sequence& sequence : running_) ++sequence.next_position;
    const int buffer = CopyToHost(drawn, rows);
    in_flight_.push_back({rows, buffer, std::make_unique<StreamMarker>(engine_.device_)});
    engine_.stats_.decode_steps += 1;
  }

  // Collects the steps in flight and retires the sequences that stopped; each running sequence's
  // next position then follows from its tokens. False when nothing is left running.
  bool Settle() {
    CollectAll();
    Retire();
    for (Sequence& sequence : running_) sequence.next_position = ContextLength(sequence) - 1;
    return !running_.empty();
  }

  // Gives each running sequence whose next position starts a block a new one, recording the
  // table entries; false (taking none) when fewer are free than needed.
  bool TakeStepBlocks() {
    int64_t needed = 0;
    for (const Sequence& sequence : running_) {
      needed += NeedsBlock(sequence) ? 1 : 0;
    }
    if (needed > pool_.free_blocks()) return false;
    for (size_t row = 0; row < running_.size(); ++row) {
      Sequence& sequence = running_[row];
      if (!NeedsBlock(sequence)) continue;
      sequence.blocks.push_back(pool_.Take());
      table_updates_.push_back({static_cast<int64_t>(row),
                                static_cast<int64_t>(sequence.blocks.size()) - 1,
                                sequence.blocks.back()});
    }
    NoteBlocksHeld();
    return true;
  }

  void NoteBlocksHeld() {
    engine_.stats_.peak_blocks = std::max(engine_.stats_.peak_blocks, pool_.held_blocks());
  }

  bool NeedsBlock(const Sequence& sequence) const {
    return sequence.state == Sequence::State::kRunning &&
           sequence.next_position >=
               static_cast<int64_t>(sequence.blocks.size()) * pool_.block_size();
  }

  // Preempts the sequences admitted last until this step's blocks are free: each gives its blocks
  // up and waits, with its tokens so far, at the head of requeued_. No step may be in flight.
  void Preempt() {
    while (!running_.empty()) {
      int64_t needed = 0;
      for (const Sequence& sequence : running_) needed += NeedsBlock(sequence) ? 1 : 0;
      if (needed <= pool_.free_blocks()) return;
      Sequence victim = std::move(running_.back());
      running_.pop_back();
      ReleaseBlocks(victim);
      requeued_.push_front(std::move(victim));
      engine_.stats_.preemptions += 1;
    }
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

  // Decode inputs of running_ (token, position and block table per row) into step_inputs_ and
  // block_tables_. Rows past running_ (graph padding), and table entries past a sequence's
  // blocks, point at the scratch block.
  void UploadStepInputs() {
    const int64_t rows = static_cast<int64_t>(running_.size());
    const int64_t max_blocks = engine_.max_blocks_, scratch = engine_.cache_->scratch_block();
    int64_t* token = engine_.host_inputs_.data_ptr<int64_t>();
    int64_t* position = token + rows_;
    int64_t* table = engine_.host_tables_.data_ptr<int64_t>();
    std::fill_n(token + rows, rows_ - rows, 0);
    std::fill_n(position + rows, rows_ - rows, 0);
    std::fill_n(table, rows_ * max_blocks, scratch);
    for (int64_t i = 0; i < rows; ++i) {
      const Sequence& sequence = running_[i];
      token[i] = sequence.completion.token_ids.back();
      position[i] = sequence.next_position;
      std::copy(sequence.blocks.begin(), sequence.blocks.end(), table + i * max_blocks);
    }
    engine_.step_inputs_.copy_(engine_.host_inputs_, /*non_blocking=*/true);
    engine_.block_tables_.copy_(engine_.host_tables_, /*non_blocking=*/true);
    table_updates_.clear();  // The whole table is up.
  }

  // The table entries of blocks taken since the inputs were uploaded, written on the device
  // ahead of the step: one asynchronous copy of the first `count` (row, index, block) triples,
  // contiguous in a pinned buffer, and a scatter. Two pinned buffers in turn: the one written now
  // was last read by the copy of two steps ago, which has been collected.
  void UploadTableUpdates() {
    if (table_updates_.empty()) return;
    const int64_t count = static_cast<int64_t>(table_updates_.size());
    const at::Tensor staging = engine_.host_table_updates_[next_update_buffer_].narrow(0, 0, count);
    next_update_buffer_ = 1 - next_update_buffer_;
    std::copy(table_updates_.begin(), table_updates_.end(),
              reinterpret_cast<std::array<int64_t, 3>*>(staging.data_ptr<int64_t>()));
    const at::Tensor device = engine_.device_table_updates_.narrow(0, 0, count);
    device.copy_(staging, /*non_blocking=*/true);
    engine_.block_tables_.index_put_({device.select(1, 0), device.select(1, 1)},
                                     device.select(1, 2));
    table_updates_.clear();
  }

  // Sampling parameters of running_[first, first + rows) into rows [0, rows) of the device
  // buffers: seed, counter (the next token's index), top-k / temperature, top-p.
  void UploadSamplingRows(size_t first, int64_t rows) {
    int64_t* seed = engine_.host_ints_.data_ptr<int64_t>();
    int64_t* counter = seed + rows_;
    int64_t* top_k = counter + rows_;
    float* temperature = engine_.host_floats_.data_ptr<float>();
    float* top_p = temperature + rows_;
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

  // Moves finished sequences to the results and stopped ones, their handlers told, to paused_,
  // both giving their blocks up. No step may be in flight.
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
          ReleaseBlocks(sequence);
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
  BlockPool pool_;
  const int64_t rows_;  // Sequences decoded together at most (max_num_seqs).
  std::vector<uint64_t> seeds_;
  std::vector<int64_t> eos_;
  std::deque<size_t> waiting_;
  std::vector<Sequence> running_;
  std::vector<Sequence> paused_;   // stopped, waiting on their turn handlers; no blocks
  std::deque<Sequence> requeued_;  // preempted or resuming a turn: to be prefilled again
  std::deque<Step> in_flight_;
  // Block-table entries (row, index, block) taken since the inputs were last uploaded.
  std::vector<std::array<int64_t, 3>> table_updates_;
  bool any_finished_ = false;
  bool device_inputs_valid_ = false;  // step_inputs_ and the sampling rows match running_.
  bool filtered_ = false;             // Some row of the uploaded sampling rows uses top-k / top-p.
  int next_buffer_ = 0;
  int next_update_buffer_ = 0;
};

std::vector<GenerationResult> GenerationEngine::Execute(
    const std::vector<GenerationRequest>& requests, TurnHandler* turns,
    const std::atomic<int64_t>* interrupt) {
  Run run(*this, requests, turns, interrupt);
  return run.Execute();
}

}  // namespace rlhfd::rollout

// One Generate call's scheduling state (GenerationEngine::Run), private to the engine:
// engine_run.cc admits and prefills sequences, handles stops and turns; engine_step.cc launches
// and collects the decode steps, gives them their blocks and preempts when there are none.
#pragma once

#include <ATen/Tensor.h>

#include <array>
#include <atomic>
#include <deque>
#include <future>
#include <memory>
#include <vector>

#include "worker/rollout/block_pool.h"
#include "worker/rollout/device_support.h"
#include "worker/rollout/engine.h"
#include "worker/rollout/prefill_inputs.h"
#include "worker/rollout/sampler.h"

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

  std::vector<GenerationResult> Execute();

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
  Admission Next() const;

  // Whether `next` fits beside `rows` running rows and the `reserved` blocks of this prefill's
  // earlier admissions: a row per sample, and its blocks with one more per sample to grow into,
  // unless nothing else runs (then its own samples make room for each other by preemption).
  bool Fits(const Admission& next, int64_t rows, int64_t reserved) const;

  bool CanAdmit() const;

  // Ends the call where it stands: the tokens in flight collected, and every sample not finished
  // returned as it is, interrupted (those not yet admitted with none).
  void Interrupt();

  // Admits requeued sequences, then waiting requests, while rows and blocks allow and the padded
  // prompt tokens fit the prefill budget (one always fits), prefills them together and draws each
  // sample's next token. No step may be in flight.
  void Prefill();

  // A sequence's context: its prompt, then its tokens so far.
  std::vector<int64_t> Context(const Sequence& sequence) const;

  // The n samples of waiting request `r`, appended to running_ (their blocks are Prefill's).
  void AdmitRequest(size_t r);

  at::Tensor OnDevice(const std::vector<int64_t>& values) const;

  // Prefills `inputs`; the logits after each row's last token, (B, V).
  at::Tensor PrefillForward(const PrefillInputs& inputs);

  // Draws the next token of running_[first, first + rows) from `logits` (rows, V), at once: the
  // host needs them before any decode step.
  void DrawFirst(const at::Tensor& logits, size_t first);

  bool AnyTurnReady() const;

  // The samples whose handlers have decided: finished, or their inserted tokens appended and
  // their whole context queued to be prefilled again (requeued_), then drawing its next token.
  void Resume();

  static int64_t ContextLength(const GenerationRequest& request) {
    return static_cast<int64_t>(request.prompt_ids.size() +
                                (request.resumed ? request.resumed->token_ids.size() : 0));
  }
  static int64_t ContextLength(const Sequence& sequence) {
    return sequence.prompt_length + static_cast<int64_t>(sequence.completion.token_ids.size());
  }

  // Lets a sequence's blocks go, those whose keys and values are all written (all but its last
  // token's) kept in the prefix cache, so that it finds them when it comes back.
  void ReleaseBlocks(Sequence& sequence);

  // Moves a sample to the results and frees its blocks.
  void Finish(Sequence sequence);

  // Launches one decode step over every running sequence. Inputs come from the device when the
  // running set is unchanged since the last step, else from the host (after collecting). Each
  // sequence first gets the block its position needs; when too few are free the sequences
  // admitted last are preempted.
  void LaunchDecode();

  // Collects the steps in flight and retires the sequences that stopped; each running sequence's
  // next position then follows from its tokens. False when nothing is left running.
  bool Settle();

  // Gives each running sequence whose next position starts a block a new one, recording the
  // table entries; false (taking none) when fewer are free than needed.
  bool TakeStepBlocks();

  void NoteBlocksHeld();

  bool NeedsBlock(const Sequence& sequence) const;

  // Preempts the sequences admitted last until this step's blocks are free: each gives its blocks
  // up and waits, with its tokens so far, at the head of requeued_. No step may be in flight.
  void Preempt();

  // Tensor-parallel: waits for the group's queued collectives within the communicator's timeout
  // (a peer that died fails here, as an error, rather than leaving a host wait on the stream
  // hanging).
  void AwaitGroup();

  void CollectOldest();

  void CollectAll();

  // Decode inputs of running_ (token, position and block table per row) into step_inputs_ and
  // block_tables_. Rows past running_ (graph padding), and table entries past a sequence's
  // blocks, point at the scratch block.
  void UploadStepInputs();

  // The table entries of blocks taken since the inputs were uploaded, written on the device
  // ahead of the step: one asynchronous copy of the first `count` (row, index, block) triples,
  // contiguous in a pinned buffer, and a scatter. Two pinned buffers in turn: the one written now
  // was last read by the copy of two steps ago, which has been collected.
  void UploadTableUpdates();

  // Sampling parameters of running_[first, first + rows) into rows [0, rows) of the device
  // buffers: seed, counter (the next token's index), top-k / temperature, top-p.
  void UploadSamplingRows(size_t first, int64_t rows);

  SamplingRows DeviceSamplingRows(int64_t rows) const;

  // Starts copying drawn tokens and log-probs to the next pinned output buffer; returns it.
  int CopyToHost(const SampledTokens& drawn, int64_t rows);

  // Appends the tokens of output `buffer` to running_[first, first + rows), skipping sequences
  // already stopped, and marks those that stop now: finished, or (a stop with a turn handler)
  // waiting on it.
  void Append(size_t first, int64_t rows, int buffer);

  // Moves finished sequences to the results and stopped ones, their handlers told, to paused_,
  // both giving their blocks up. No step may be in flight.
  void Retire();

  GenerationEngine& engine_;
  const std::vector<GenerationRequest>& requests_;
  TurnHandler* turns_;                     // null: every stop finishes its sample
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

}  // namespace rlhfd::rollout

// One Generate call's decode steps (GenerationEngine::Run): launched pipelined, their inputs and
// block-table entries staged to the device, their tokens collected, sequences that stop retired;
// the blocks each step needs taken first, preempting the sequences admitted last when there are
// none. engine_run.cc holds admission and prefills.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "worker/rollout/engine_run.h"
#include "worker/rollout/sampling_math.h"

namespace rlhfd::rollout {

void GenerationEngine::Run::LaunchDecode() {
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
  const at::Tensor logits = engine_.graphs_.empty()
                                ? engine_.DecodeForward(bucket)
                                : engine_.graphs_.Replay(bucket, [this, bucket] {
                                    return engine_.DecodeForward(bucket);
                                  });
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

bool GenerationEngine::Run::Settle() {
  CollectAll();
  Retire();
  for (Sequence& sequence : running_) sequence.next_position = ContextLength(sequence) - 1;
  return !running_.empty();
}

bool GenerationEngine::Run::TakeStepBlocks() {
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

void GenerationEngine::Run::NoteBlocksHeld() {
  engine_.stats_.peak_blocks = std::max(engine_.stats_.peak_blocks, pool_.held_blocks());
}

bool GenerationEngine::Run::NeedsBlock(const Sequence& sequence) const {
  return sequence.state == Sequence::State::kRunning &&
         sequence.next_position >=
             static_cast<int64_t>(sequence.blocks.size()) * pool_.block_size();
}

void GenerationEngine::Run::Preempt() {
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

void GenerationEngine::Run::AwaitGroup() {
  if (engine_.group_ == nullptr) return;
  const absl::Status status = engine_.group_->Synchronize();
  TORCH_CHECK(status.ok(),
              "tensor-parallel decode: waiting for the group: ", std::string(status.message()));
}

void GenerationEngine::Run::CollectOldest() {
  Step step = std::move(in_flight_.front());
  in_flight_.pop_front();
  // Tensor-parallel: a step slow to finish may be waiting on a peer that is gone; the group's
  // own wait tells, within its timeout (it waits for the step after this one too, so only then).
  if (engine_.group_ != nullptr && !step.done->WaitFor(std::chrono::seconds(1))) AwaitGroup();
  step.done->Wait();
  Append(0, step.rows, step.buffer);
}

void GenerationEngine::Run::CollectAll() {
  while (!in_flight_.empty()) CollectOldest();
}

void GenerationEngine::Run::UploadStepInputs() {
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

void GenerationEngine::Run::UploadTableUpdates() {
  if (table_updates_.empty()) return;
  const int64_t count = static_cast<int64_t>(table_updates_.size());
  const at::Tensor staging = engine_.host_table_updates_[next_update_buffer_].narrow(0, 0, count);
  next_update_buffer_ = 1 - next_update_buffer_;
  std::copy(table_updates_.begin(), table_updates_.end(),
            reinterpret_cast<std::array<int64_t, 3>*>(staging.data_ptr<int64_t>()));
  const at::Tensor device = engine_.device_table_updates_.narrow(0, 0, count);
  device.copy_(staging, /*non_blocking=*/true);
  engine_.block_tables_.index_put_({device.select(1, 0), device.select(1, 1)}, device.select(1, 2));
  table_updates_.clear();
}

void GenerationEngine::Run::UploadSamplingRows(size_t first, int64_t rows) {
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

SamplingRows GenerationEngine::Run::DeviceSamplingRows(int64_t rows) const {
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

int GenerationEngine::Run::CopyToHost(const SampledTokens& drawn, int64_t rows) {
  const int buffer = next_buffer_;
  next_buffer_ = 1 - next_buffer_;
  engine_.host_tokens_[buffer].narrow(0, 0, rows).copy_(drawn.tokens, /*non_blocking=*/true);
  engine_.host_logprobs_[buffer].narrow(0, 0, rows).copy_(drawn.logprobs, /*non_blocking=*/true);
  return buffer;
}

void GenerationEngine::Run::Append(size_t first, int64_t rows, int buffer) {
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

void GenerationEngine::Run::Retire() {
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
        sequence.next_turn = turns_->OnStop(sequence.request, sequence.sample, sequence.completion);
        paused_.push_back(std::move(sequence));
        break;
    }
  }
  running_ = std::move(still_running);
  any_finished_ = false;
  device_inputs_valid_ = false;
}

}  // namespace rlhfd::rollout

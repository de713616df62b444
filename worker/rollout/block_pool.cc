#include "worker/rollout/block_pool.h"

#include <c10/util/Exception.h>

namespace rlhfd::rollout {

BlockPool::BlockPool(int64_t blocks, int64_t block_size, bool prefix_caching)
    : block_size_(block_size),
      prefix_caching_(prefix_caching),
      holders_(blocks, 0),
      content_(blocks),
      unheld_position_(blocks, unheld_cached_.end()) {
  free_.reserve(blocks);
  for (int64_t block = blocks - 1; block >= 0; --block) free_.push_back(block);
}

int64_t BlockPool::Take() {
  int64_t block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else {
    TORCH_CHECK(!unheld_cached_.empty(),
                "BlockPool: no free block (the scheduler checks before taking)");
    block = unheld_cached_.front();
    unheld_cached_.pop_front();
    unheld_position_[block] = unheld_cached_.end();
    Forget(block);
  }
  holders_[block] = 1;
  return block;
}

void BlockPool::Share(int64_t block) {
  TORCH_CHECK(holders_.at(block) > 0, "BlockPool: sharing block ", block, ", which is free");
  ++holders_[block];
}

void BlockPool::Release(int64_t block) {
  TORCH_CHECK(holders_.at(block) > 0, "BlockPool: releasing block ", block, ", which is free");
  if (--holders_[block] > 0) return;
  if (content_[block]) {
    unheld_position_[block] = unheld_cached_.insert(unheld_cached_.end(), block);
  } else {
    free_.push_back(block);
  }
}

uint64_t BlockPool::Register(int64_t block, uint64_t parent, std::span<const int64_t> tokens) {
  TORCH_CHECK(holders_.at(block) > 0, "BlockPool: registering block ", block, ", which is free");
  if (!prefix_caching_) return 0;
  if (content_[block]) return cached_.at(*content_[block]).key;
  Content content{parent, std::vector<int64_t>(tokens.begin(), tokens.end())};
  uint64_t key = next_key_;
  if (const auto found = cached_.find(content); found != cached_.end()) {
    const int64_t other = found->second.block;
    if (holders_[other] > 0) return found->second.key;
    key = found->second.key;  // Moves to `block`: `other` is unheld, so it would go first.
    unheld_cached_.erase(unheld_position_[other]);
    unheld_position_[other] = unheld_cached_.end();
    Forget(other);
    free_.push_back(other);
  } else {
    ++next_key_;
  }
  cached_.emplace(content, Cached{block, key});
  content_[block] = std::move(content);
  return key;
}

std::optional<std::pair<int64_t, uint64_t>> BlockPool::Acquire(uint64_t parent,
                                                               std::span<const int64_t> tokens) {
  if (!prefix_caching_) return std::nullopt;
  const auto found =
      cached_.find(Content{parent, std::vector<int64_t>(tokens.begin(), tokens.end())});
  if (found == cached_.end()) return std::nullopt;
  const int64_t block = found->second.block;
  if (holders_[block] == 0) {
    unheld_cached_.erase(unheld_position_[block]);
    unheld_position_[block] = unheld_cached_.end();
  }
  ++holders_[block];
  return std::make_pair(block, found->second.key);
}

int64_t BlockPool::TakeContext(std::span<const int64_t> context, std::vector<int64_t>& blocks) {
  const int64_t length = static_cast<int64_t>(context.size());
  uint64_t parent = 0;
  for (int64_t block = 0; (block + 1) * block_size_ < length; ++block) {
    const auto hit = Acquire(parent, BlockTokens(context, block));
    if (!hit) break;
    blocks.push_back(hit->first);
    parent = hit->second;
  }
  const int64_t cached = static_cast<int64_t>(blocks.size()) * block_size_;
  while (static_cast<int64_t>(blocks.size()) < BlocksFor(length)) blocks.push_back(Take());
  return cached;
}

std::optional<std::pair<int64_t, int64_t>> BlockPool::ShareContext(
    const std::vector<int64_t>& first, int64_t length, std::vector<int64_t>& sibling) {
  const int64_t full = length / block_size_;
  for (int64_t block = 0; block < full; ++block) {
    Share(first[block]);
    sibling.push_back(first[block]);
  }
  if (full == static_cast<int64_t>(first.size())) return std::nullopt;
  sibling.push_back(Take());
  return std::make_pair(first.back(), sibling.back());
}

void BlockPool::RegisterWritten(std::span<const int64_t> context,
                                const std::vector<int64_t>& blocks, int64_t written) {
  uint64_t parent = 0;
  const int64_t held = static_cast<int64_t>(blocks.size());
  for (int64_t block = 0; block < held && (block + 1) * block_size_ <= written; ++block) {
    parent = Register(blocks[block], parent, BlockTokens(context, block));
    if (parent == 0) return;  // Prefix caching off.
  }
}

void BlockPool::ReleaseContext(std::span<const int64_t> context, std::vector<int64_t>& blocks,
                               int64_t written) {
  RegisterWritten(context, blocks, written);
  for (auto block = blocks.rbegin(); block != blocks.rend(); ++block) Release(*block);
  blocks.clear();
}

void BlockPool::Forget(int64_t block) {
  if (!content_[block]) return;
  cached_.erase(*content_[block]);
  content_[block].reset();
}

}  // namespace rlhfd::rollout

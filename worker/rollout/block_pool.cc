#include "worker/rollout/block_pool.h"

#include <c10/util/Exception.h>

namespace rlhfd::rollout {

BlockPool::BlockPool(int64_t blocks) : holders_(blocks, 0) {
  free_.reserve(blocks);
  for (int64_t block = blocks - 1; block >= 0; --block) free_.push_back(block);
}

int64_t BlockPool::Take() {
  TORCH_CHECK(!free_.empty(), "BlockPool: no free block (the scheduler checks before taking)");
  const int64_t block = free_.back();
  free_.pop_back();
  holders_[block] = 1;
  return block;
}

void BlockPool::Share(int64_t block) {
  TORCH_CHECK(holders_.at(block) > 0, "BlockPool: sharing block ", block, ", which is free");
  ++holders_[block];
}

void BlockPool::Release(int64_t block) {
  TORCH_CHECK(holders_.at(block) > 0, "BlockPool: releasing block ", block, ", which is free");
  if (--holders_[block] == 0) free_.push_back(block);
}

}  // namespace rlhfd::rollout

// The paged KV cache's blocks as the scheduler sees them: a free list and a holder count per
// block. The n samples of a prompt hold its prompt's full blocks together; a block goes back to
// the free list when its last holder lets it go. Host-only bookkeeping; the cache's tensors are
// PagedKvCache's.
#pragma once

#include <cstdint>
#include <vector>

namespace rlhfd::rollout {

class BlockPool {
 public:
  explicit BlockPool(int64_t blocks);  // Blocks 0 .. blocks - 1, all free.

  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t held_blocks() const { return static_cast<int64_t>(holders_.size() - free_.size()); }
  // A free block, now held once. Requires free_blocks() > 0.
  int64_t Take();
  // One more holder of a held block.
  void Share(int64_t block);
  // One holder fewer; the block is free again when none is left.
  void Release(int64_t block);

 private:
  std::vector<int64_t> free_;     // Taken from the back: the lowest ids first.
  std::vector<int32_t> holders_;  // Per block.
};

}  // namespace rlhfd::rollout

// The paged KV cache's blocks as the scheduler sees them: a free list, a holder count per block,
// and a prefix cache. The n samples of a prompt hold its prompt's full blocks together; a block
// goes back to the pool when its last holder lets it go.
//
// Prefix cache (vLLM's automatic prefix caching, within one Generate call: the weights do not
// change inside it): a full block whose keys and values are all written can be registered under
// its content, the key of the block before it (0 for a sequence's first block) and its tokens.
// A registered block nobody holds stays cached, least recently released first to be reused, so a
// later sequence with the same tokens from position 0 (a multi-turn sample going on, a preempted
// one coming back, prompts sharing a system prompt) takes it instead of computing it again. Keys
// are never reused, so a block registered under a parent that was since evicted can no longer
// be found. Host-only bookkeeping; the cache's tensors are PagedKvCache's.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace rlhfd::rollout {

class BlockPool {
 public:
  // Blocks 0 .. blocks - 1 of `block_size` positions, all free; `prefix_caching` false: nothing
  // is ever registered.
  BlockPool(int64_t blocks, int64_t block_size, bool prefix_caching);

  int64_t block_size() const { return block_size_; }
  int64_t BlocksFor(int64_t positions) const { return (positions + block_size_ - 1) / block_size_; }

  // Blocks Take() can hand out: free ones and cached ones nobody holds.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + unheld_cached_.size()); }
  int64_t held_blocks() const { return static_cast<int64_t>(holders_.size()) - free_blocks(); }
  // A block, now held once: a free one, else the cached one released longest ago (dropped from
  // the cache). Requires free_blocks() > 0.
  int64_t Take();
  // One more holder of a held block.
  void Share(int64_t block);
  // One holder fewer; with none left the block is free again, or cached when registered.
  void Release(int64_t block);

  // The key of the content `tokens` after the block with key `parent`, which held `block` holds:
  // its own registration if it has one; else, when another block is registered with that content,
  // that one's key (the registration moving to `block` when nobody holds the other, which goes
  // back to the free list, so the content stays cached as long as anyone holds it); else a new
  // key for `block`. 0 when prefix caching is off.
  uint64_t Register(int64_t block, uint64_t parent, std::span<const int64_t> tokens);
  // The cached block holding `tokens` after the block with key `parent`, now held once more,
  // with its key; none when no block holds them.
  std::optional<std::pair<int64_t, uint64_t>> Acquire(uint64_t parent,
                                                      std::span<const int64_t> tokens);

  // A sequence's blocks, in position order, for its context (its prompt and tokens so far):
  // Into empty `blocks`, the context's cached whole blocks from position 0 on (short of its last
  // token, whose logits a prefill must compute), then new ones for the rest; returns the
  // positions found cached.
  int64_t TakeContext(std::span<const int64_t> context, std::vector<int64_t>& blocks);
  // Into empty `sibling`: the whole blocks of `first`, which holds a context of `length`
  // positions, shared, and a new block for a partly filled last one; returns (first's, the
  // sibling's) for the caller to copy, when there is one.
  std::optional<std::pair<int64_t, int64_t>> ShareContext(const std::vector<int64_t>& first,
                                                          int64_t length,
                                                          std::vector<int64_t>& sibling);
  // Registers the whole blocks among the first `written` positions of `context`.
  void RegisterWritten(std::span<const int64_t> context, const std::vector<int64_t>& blocks,
                       int64_t written);
  // RegisterWritten, then lets all of `blocks` go, last first (cached blocks are evicted in the
  // order they were released, and a prefix is found only from its first block on).
  void ReleaseContext(std::span<const int64_t> context, std::vector<int64_t>& blocks,
                      int64_t written);

 private:
  using Content = std::pair<uint64_t, std::vector<int64_t>>;  // (parent key, tokens)
  struct Cached {
    int64_t block;
    uint64_t key;
  };
  void Forget(int64_t block);  // Drops a block's registration.

  std::span<const int64_t> BlockTokens(std::span<const int64_t> context, int64_t block) const {
    return context.subspan(block * block_size_, block_size_);
  }

  const int64_t block_size_;
  const bool prefix_caching_;
  std::vector<int64_t> free_;     // Taken from the back: the lowest ids first.
  std::vector<int32_t> holders_;  // Per block.
  absl::flat_hash_map<Content, Cached> cached_;
  std::vector<std::optional<Content>> content_;  // Per block: what it is registered as.
  std::list<int64_t> unheld_cached_;             // Released longest ago first.
  std::vector<std::list<int64_t>::iterator> unheld_position_;  // Per block, when in that list.
  uint64_t next_key_ = 1;
};

}  // namespace rlhfd::rollout

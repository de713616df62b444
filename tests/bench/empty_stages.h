// A worker's stages that answer every call at once with an empty reply: the base of the fake
// workers that the driver's tests and benchmarks run over, each overriding the stages it holds,
// times or fails.
#pragma once

#include "common/stages/stage_service.h"

namespace rlhfd::bench {

class EmptyStages : public stages::StageService {
 public:
#define RLHFD_EMPTY_STAGE(Name, Request, Reply)                                               \
  void Name(const v1::Request&, absl::Duration, stages::StageDone<v1::Reply> done) override { \
    done(v1::Reply());                                                                        \
  }
  RLHFD_STAGES(RLHFD_EMPTY_STAGE)
#undef RLHFD_EMPTY_STAGE
};

}  // namespace rlhfd::bench

// Anchor source of the rlhfd_torch_pch target, whose precompiled header others reuse.
#include "worker/torch_pch.h"

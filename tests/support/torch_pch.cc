// Anchor source of the rlhfd_torch_pch target, whose precompiled header others reuse.
#include "tests/support/torch_pch.h"

// The precompiled header of every LibTorch target: the narrow ATen/torch headers they share.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

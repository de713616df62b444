// Token log-probs: log_softmax gathered at the chosen tokens.
#include "worker/train/log_probs.h"

#include <ATen/ATen.h>

namespace rlhfd::train {

at::Tensor TokenLogProbs(const at::Tensor& logits, const at::Tensor& tokens) {
  // log p = logit[token] - logsumexp(logits); gathering first keeps the (B, T, V) work to one pass.
  return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - at::logsumexp(logits, -1);
}

at::Tensor TokenEntropy(const at::Tensor& logits) {
  const at::Tensor log_p = at::log_softmax(logits, -1);
  return -(log_p.exp() * log_p).sum(-1);
}

}  // namespace rlhfd::train

#include "pagellm/sampling/rules.h"

#include "pagellm/common/check.h"

namespace pagellm {

void PenaltyCounter::count(const std::vector<int32_t>* prompt, const std::vector<int32_t>* output,
                           bool repetition, int64_t vocab_size, std::vector<PenaltyCount>& out,
                           const std::vector<int32_t>* banned) {
  // Check every id before marking anything, so that a throw leaves the scratch clean.
  auto check_ids = [vocab_size](const std::vector<int32_t>* ids, const char* what) {
    if (ids == nullptr) return;
    for (int32_t t : *ids) {
      PAGELLM_CHECK(t >= 0 && t < vocab_size)
          << "sampling: " << what << " token id " << t << " is outside the vocabulary [0, "
          << vocab_size << ")";
    }
  };
  check_ids(output, "output");
  if (repetition) check_ids(prompt, "prompt");
  check_ids(banned, "banned");
  const size_t v = static_cast<size_t>(vocab_size);
  if (counts_.size() < v) counts_.resize(v, 0);
  if (seen_.size() < v) seen_.resize(v, 0);

  touched_.clear();
  auto mark = [this](int32_t t) {
    if (!seen_[static_cast<size_t>(t)]) {
      seen_[static_cast<size_t>(t)] = 1;
      touched_.push_back(t);
    }
  };
  if (output != nullptr) {
    for (int32_t t : *output) {
      mark(t);
      ++counts_[static_cast<size_t>(t)];
    }
  }
  if (repetition && prompt != nullptr) {
    for (int32_t t : *prompt) mark(t);
  }
  if (banned != nullptr) {
    for (int32_t t : *banned) {
      mark(t);
      counts_[static_cast<size_t>(t)] = kBannedToken;
    }
  }
  for (int32_t t : touched_) {
    out.push_back(PenaltyCount{t, counts_[static_cast<size_t>(t)]});
    seen_[static_cast<size_t>(t)] = 0;
    counts_[static_cast<size_t>(t)] = 0;
  }
  touched_.clear();
}

}  // namespace pagellm

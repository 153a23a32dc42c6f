// Human- and machine-readable accounts of an AttentionPlan, for `pagellm attention-plan`,
// logs and error messages.
#pragma once

#include <string>

#include "pagellm/attention/planner.h"

namespace pagellm {

/// A multi-line account: the provider, the rule that decided, every rule's verdict with its
/// reason, the batch facts (work, maxima) and, for cuDNN, the plan key. For example
///   provider: native
///   decided by: rule 3 (work): work 4096 is below the measured crossover 50331648
///   1. domain       pass
///   2. consistency  pass
///   3. work         fail  work 4096 is below the measured crossover 50331648 ...
///   ...
std::string explain_text(const AttentionPlan& plan, const AttentionDomain& domain,
                         const DeviceProfile& device);

/// The same as one JSON object (pretty-printed).
std::string explain_json(const AttentionPlan& plan, const AttentionDomain& domain,
                         const DeviceProfile& device);

}  // namespace pagellm

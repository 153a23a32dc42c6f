#include "pagellm/common/kernel_timeline.h"

#include <algorithm>
#include <map>

#include "pagellm/common/check.h"

namespace pagellm {
namespace {

constexpr int kMaxPeriod = 64;
constexpr int kMinRepeats = 4;

/// The smallest period p such that names[i] == names[i + p] holds along a stretch of at
/// least kMinRepeats periods; 0 if none.
int find_period(const std::vector<std::string>& names) {
  const int64_t n = static_cast<int64_t>(names.size());
  for (int p = 1; p <= kMaxPeriod && 2 * p <= n; ++p) {
    int64_t run = 0;
    for (int64_t i = 0; i + p < n; ++i) {
      run = names[i] == names[i + p] ? run + 1 : 0;
      if (run >= int64_t{kMinRepeats - 1} * p) return p;
    }
  }
  return 0;
}

/// Rows by name (count, duration and attribution summed), most attributed time first, or
/// without attribution (host calls) most duration first.
std::vector<TimelineRow> rows_by_name(const std::vector<KernelSpan>& spans,
                                      const std::vector<double>& attributed) {
  std::map<std::string, TimelineRow> rows;
  for (size_t i = 0; i < spans.size(); ++i) {
    TimelineRow& r = rows[spans[i].name];
    r.label = spans[i].name;
    ++r.count;
    r.attributed_ns += attributed.empty() ? 0.0 : attributed[i];
    r.duration_ns += static_cast<double>(spans[i].end_ns - spans[i].start_ns);
  }
  std::vector<TimelineRow> sorted;
  for (auto& [name, row] : rows) sorted.push_back(row);
  const bool by_attribution = !attributed.empty();
  std::stable_sort(sorted.begin(), sorted.end(), [&](const TimelineRow& a, const TimelineRow& b) {
    return by_attribution ? a.attributed_ns > b.attributed_ns : a.duration_ns > b.duration_ns;
  });
  return sorted;
}

}  // namespace

std::string short_kernel_name(const std::string& demangled) {
  std::string s = demangled;
  for (size_t at; (at = s.find("(anonymous namespace)")) != std::string::npos;) {
    s.replace(at, 21, "anon");
  }
  // Cut the parameter list: the first '(' outside template brackets.
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0) {
      s.resize(i);
      break;
    }
  }
  // The name starts after the last "::" or ' ' (return type) outside template brackets.
  size_t begin = 0;
  depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (depth == 0 && (s[i] == ' ' || (s[i] == ':' && i + 1 < s.size() && s[i + 1] == ':'))) {
      begin = s[i] == ' ' ? i + 1 : i + 2;
    }
  }
  s = s.substr(begin);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

KernelTimeline summarize_kernel_timeline(std::vector<KernelSpan> spans) {
  KernelTimeline t;
  for (const KernelSpan& s : spans) {
    PAGELLM_CHECK(s.end_ns >= s.start_ns)
        << "kernel timeline: span '" << s.name << "' ends (" << s.end_ns << " ns) before it starts ("
        << s.start_ns << " ns)";
  }
  const auto host = std::stable_partition(spans.begin(), spans.end(), [](const KernelSpan& s) {
    return s.kind != KernelSpan::Kind::kHostCall;
  });
  t.host_calls = rows_by_name(std::vector<KernelSpan>(host, spans.end()), {});
  spans.erase(host, spans.end());
  if (spans.empty()) return t;
  std::stable_sort(spans.begin(), spans.end(),
                   [](const KernelSpan& a, const KernelSpan& b) { return a.start_ns < b.start_ns; });
  t.kernels = static_cast<int64_t>(spans.size());

  // Attribution: walking in start order, the instants after everything earlier has ended
  // and up to this kernel's end are this kernel's; a start after that point leaves a gap.
  std::vector<double> attributed(spans.size(), 0.0);
  uint64_t covered = spans.front().start_ns;
  uint64_t last_end = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const KernelSpan& s = spans[i];
    if (s.start_ns > covered) t.idle_ns += static_cast<double>(s.start_ns - covered);
    const uint64_t from = std::max(s.start_ns, covered);
    if (s.end_ns > from) attributed[i] = static_cast<double>(s.end_ns - from);
    covered = std::max(covered, s.end_ns);
    last_end = std::max(last_end, s.end_ns);
  }
  t.wall_ns = static_cast<double>(last_end - spans.front().start_ns);

  t.by_name = rows_by_name(spans, attributed);

  // The repeating unit: every maximal stretch in which names repeat with the period, at
  // least kMinRepeats periods long, aligned to the first such stretch's phase.
  std::vector<std::string> names;
  names.reserve(spans.size());
  for (const KernelSpan& s : spans) names.push_back(s.name);
  const int p = find_period(names);
  if (p == 0) return t;
  const int64_t n = static_cast<int64_t>(names.size());
  std::vector<std::string> reference;  // the unit's names, from the first stretch
  int64_t i = 0;
  while (i + p < n) {
    int64_t end = i;  // the stretch [i, end + p) repeats with period p
    while (end + p < n && names[end] == names[end + p]) ++end;
    const int64_t length = end + p - i;
    if (end == i || length < int64_t{kMinRepeats} * p) {
      i = end + 1;
      continue;
    }
    int phase = 0;  // position in the unit of names[i]
    if (reference.empty()) {
      reference.assign(names.begin() + i, names.begin() + i + p);
      t.by_position.resize(static_cast<size_t>(p));
      for (int j = 0; j < p; ++j) t.by_position[j].label = reference[j];
    } else {
      phase = -1;
      for (int r = 0; r < p && phase < 0; ++r) {
        bool same = true;
        for (int j = 0; j < p && same; ++j) same = names[i + j] == reference[(r + j) % p];
        if (same) phase = r;
      }
    }
    if (phase >= 0) {
      // Whole units only, so that every position is counted equally often.
      const int64_t units = length / p;
      for (int64_t k = i; k < i + units * p; ++k) {
        TimelineRow& r = t.by_position[static_cast<size_t>((phase + (k - i)) % p)];
        ++r.count;
        r.attributed_ns += attributed[static_cast<size_t>(k)];
        r.duration_ns += static_cast<double>(spans[k].end_ns - spans[k].start_ns);
      }
      t.period_repeats += units;
    }
    i += length;
  }
  t.period = p;
  return t;
}

}  // namespace pagellm

// The shape class of a paged-attention call: where in the (query length, KV length) plane
// it lies, and whether its query lengths differ. Crossover entries are keyed by it, because
// a single work threshold cannot say where cuDNN wins: on an H200 it wins short query chunks
// over long cached prefixes (chunk 512 after 8192: 296 against 389 us) and loses long fresh
// prompts of similar work (1 x 2048: 187 against 129 us) and mixed batches (1 x 2048 + 63
// one-token rows: 1188 against 167 us).
//
// Prefill classes: the call's query tokens (all sequences together) and its largest KV
// length, each in one of six powers-of-4 buckets, and `ragged` when query lengths differ
// within the batch.
//   query tokens: 1 | 2-64 | 65-256 | 257-1024 | 1025-4096 | 4097+
//   KV:           1-256 | 257-1024 | 1025-4096 | 4097-16384 | 16385-65536 | 65537+
// The query axis counts all tokens, not the longest query, because that is what sets the
// native kernel's parallelism (query tiles x heads): on the H200 cuDNN wins one 512-token
// chunk after 4,096 cached tokens (159 against 208 us) and loses sixteen of them (2,343
// against 1,919 us), which share their largest query and KV lengths.
// Decode (every query one token) is one class whatever the KV lengths: a decode call's cost
// is linear in the K/V bytes for both providers, so its crossover is one of work alone, and
// a captured decode graph, which replays every KV length up to its capacity, meets a single
// class (its decision is judged over the whole capacity by rule 3).
#pragma once

#include <cstdint>
#include <string>

#include "pagellm/attention/provider.h"

namespace pagellm {

inline constexpr int kNumQueryBuckets = 6;
inline constexpr int kNumKvBuckets = 6;

/// One cell of the (query, KV) plane, plus raggedness. The decode class is {0, 0, false}.
struct ShapeClass {
  int8_t query_bucket = 0;  // 0: one token (decode); 1..5 as above
  int8_t kv_bucket = 0;     // 0..5 (always 0 for decode)
  bool ragged = false;      // query lengths differ within the batch (never for decode)

  bool decode() const { return query_bucket == 0; }
  bool operator==(const ShapeClass& o) const {
    return query_bucket == o.query_bucket && kv_bucket == o.kv_bucket && ragged == o.ragged;
  }
  bool operator!=(const ShapeClass& o) const { return !(*this == o); }
  bool operator<(const ShapeClass& o) const { return code() < o.code(); }

  /// A small integer that identifies the class (for RuleResult values and ordering).
  int32_t code() const { return query_bucket * 16 + kv_bucket * 2 + (ragged ? 1 : 0); }
  static ShapeClass from_code(int64_t code);
};

/// Bucket of a query token count >= 1 (0 for one token) and of a KV length >= 1.
int query_bucket(int64_t query_tokens);
int kv_bucket(int64_t max_kv_len);

/// The class of a call: decode when max_query_len <= 1, otherwise the buckets of its query
/// tokens (all sequences) and largest KV length, and `ragged_query` (query lengths differ).
/// No allocation; a handful of compares.
ShapeClass classify_shape(int64_t max_query_len, int64_t query_tokens, int64_t max_kv_len,
                          bool ragged_query);

/// "decode" or "q257-1024 kv4097-16384 uniform" (what tables store and explain prints).
std::string shape_class_name(const ShapeClass& c);
/// The inverse of shape_class_name; throws Error naming the text and the accepted forms.
ShapeClass parse_shape_class(const std::string& name);

/// The phase a class belongs to.
inline AttentionPhase shape_class_phase(const ShapeClass& c) {
  return c.decode() ? AttentionPhase::kDecode : AttentionPhase::kPrefill;
}

}  // namespace pagellm

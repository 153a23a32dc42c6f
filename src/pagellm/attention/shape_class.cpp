#include "pagellm/attention/shape_class.h"

#include <sstream>

#include "pagellm/common/check.h"

namespace pagellm {
namespace {

// Inclusive upper bounds of the buckets below the last (powers of 4).
constexpr int64_t kQueryUpper[kNumQueryBuckets - 1] = {1, 64, 256, 1024, 4096};
constexpr int64_t kKvUpper[kNumKvBuckets - 1] = {256, 1024, 4096, 16384, 65536};

constexpr const char* kQueryNames[kNumQueryBuckets] = {"q1",        "q2-64",      "q65-256",
                                                       "q257-1024", "q1025-4096", "q4097+"};
constexpr const char* kKvNames[kNumKvBuckets] = {"kv1-256",      "kv257-1024",    "kv1025-4096",
                                                 "kv4097-16384", "kv16385-65536", "kv65537+"};

template <int N>
int bucket_of(int64_t x, const int64_t (&upper)[N]) {
  int b = 0;
  while (b < N && x > upper[b]) ++b;
  return b;
}

template <int N>
int index_of(const std::string& name, const char* const (&names)[N]) {
  for (int i = 0; i < N; ++i) {
    if (name == names[i]) return i;
  }
  return -1;
}

}  // namespace

ShapeClass ShapeClass::from_code(int64_t code) {
  ShapeClass c;
  c.query_bucket = static_cast<int8_t>(code / 16);
  c.kv_bucket = static_cast<int8_t>((code % 16) / 2);
  c.ragged = code % 2 != 0;
  return c;
}

int query_bucket(int64_t query_tokens) { return bucket_of(query_tokens, kQueryUpper); }
int kv_bucket(int64_t max_kv_len) { return bucket_of(max_kv_len, kKvUpper); }

ShapeClass classify_shape(int64_t max_query_len, int64_t query_tokens, int64_t max_kv_len,
                          bool ragged_query) {
  ShapeClass c;
  if (max_query_len <= 1) return c;  // decode: one class whatever the KV lengths
  c.query_bucket = static_cast<int8_t>(query_bucket(query_tokens));
  c.kv_bucket = static_cast<int8_t>(kv_bucket(max_kv_len));
  c.ragged = ragged_query;
  return c;
}

std::string shape_class_name(const ShapeClass& c) {
  if (c.decode()) return "decode";
  if (c.query_bucket < 0 || c.query_bucket >= kNumQueryBuckets || c.kv_bucket < 0 ||
      c.kv_bucket >= kNumKvBuckets) {
    return "invalid class " + std::to_string(c.code());
  }
  std::ostringstream s;
  s << kQueryNames[c.query_bucket] << " " << kKvNames[c.kv_bucket] << " "
    << (c.ragged ? "ragged" : "uniform");
  return s.str();
}

ShapeClass parse_shape_class(const std::string& name) {
  if (name == "decode") return ShapeClass{};
  std::istringstream in(name);
  std::string q, kv, kind, extra;
  in >> q >> kv >> kind;
  const int qb = index_of(q, kQueryNames);
  const int kb = index_of(kv, kKvNames);
  PAGELLM_CHECK(qb >= 1 && kb >= 0 && (kind == "uniform" || kind == "ragged") && !(in >> extra))
      << "shape class \"" << name
      << "\" is not \"decode\" or \"<query bucket> <KV bucket> uniform|ragged\" with a query "
         "bucket among q2-64, q65-256, q257-1024, q1025-4096, q4097+ and a KV bucket among "
         "kv1-256, kv257-1024, kv1025-4096, kv4097-16384, kv16385-65536, kv65537+";
  ShapeClass c;
  c.query_bucket = static_cast<int8_t>(qb);
  c.kv_bucket = static_cast<int8_t>(kb);
  c.ragged = kind == "ragged";
  return c;
}

}  // namespace pagellm

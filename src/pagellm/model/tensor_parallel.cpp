#include "pagellm/model/tensor_parallel.h"

#include <sstream>

#include "pagellm/common/check.h"

namespace pagellm {

TpShard plan_tensor_parallel(const Qwen3Config& c, int size, int rank) {
  PAGELLM_CHECK(size >= 1 && rank >= 0 && rank < size)
      << "tensor parallel: rank " << rank << " of " << size << " (needs 0 <= rank < size)";
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int64_t I = c.intermediate_size, V = c.vocab_size;
  std::ostringstream problems;
  if (Hq % size != 0) {
    problems << "\n  num_attention_heads " << Hq << " is not a multiple of " << size;
  }
  if (Hkv % size != 0 && size % Hkv != 0) {
    problems << "\n  num_key_value_heads " << Hkv << " neither divides nor is a multiple of "
             << size;
  }
  if (I % size != 0) problems << "\n  intermediate_size " << I << " is not a multiple of " << size;
  if (V % size != 0) problems << "\n  vocab_size " << V << " is not a multiple of " << size;
  PAGELLM_CHECK(problems.str().empty())
      << "tensor parallel size " << size << " does not fit this model:" << problems.str();
  TpShard s;
  s.rank = rank;
  s.size = size;
  s.q_heads = Hq / size;
  s.q_head_begin = rank * s.q_heads;
  if (Hkv >= size) {
    s.kv_heads = Hkv / size;
    s.kv_head_begin = rank * s.kv_heads;
  } else {
    // size / Hkv ranks share each KV head; their q heads all read it (q head h reads KV head
    // h / (Hq / Hkv), and a rank's Hq / size heads lie within one group).
    s.kv_heads = 1;
    s.kv_head_begin = rank / (size / Hkv);
  }
  s.inter = I / size;
  s.inter_begin = rank * s.inter;
  s.vocab = V / size;
  s.vocab_begin = rank * s.vocab;
  return s;
}

}  // namespace pagellm

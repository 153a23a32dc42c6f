// Tokenizer throughput: single-thread encode and decode in MB/s of UTF-8 text.
//
//   tokenizer_bench --model DIR --corpus FILE.jsonl [Google Benchmark flags]
//
// FILE.jsonl holds one {"text": ...} document per line; bench/tokenizer_bench.py writes a
// 10 MB mixed corpus (prose, code, CJK, emoji, whitespace, numbers) and runs Hugging Face
// tokenizers on the same documents in the same run, for comparison. Without --corpus, a
// built-in 1 MB mixed text is used. Without --model, the Qwen3 tokenizer is looked up the
// usual way (PAGELLM_QWEN3_TOKENIZER_DIR, data/qwen3-tokenizer), else the small
// built-in tokenizer.
//
// What is measured: Tokenizer::encode per document (so the BPE cache is warm after the
// first pass, as in a server), decode of the resulting ids, streaming decode one id at a
// time, and loading tokenizer.json. The limit for encode is memory bandwidth in principle;
// in practice it is the regex pre-tokenizer and BPE merge loop, a few hundred MB/s at best.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagellm/tokenizer/model_files.h"
#include "pagellm/tokenizer/tokenizer.h"

namespace {

std::string g_model_dir;
std::vector<std::string> g_documents;
size_t g_corpus_bytes = 0;

std::vector<std::string> builtin_documents() {
  const char* pieces[] = {
      "The quick brown fox jumps over the lazy dog. It's 2025; we'll measure tokens/s.\n",
      "def forward(self, x):\n    return self.proj(x).softmax(dim=-1)  # attention\n\n",
      "你好，世界！今天天气很好。我们一起学习人工智能和语言模型。\n",
      "こんにちは、世界。トークナイザーのテストです。안녕하세요 세계!\n",
      "👨‍👩‍👧‍👦 🏳️‍🌈 👍🏽 ❤️ emoji 😀😂🚀\n",
      "    indented      whitespace\t\t\r\n\r\n   1234567890 3.14159 1,234,567\n",
      "<|im_start|>user\nWhat is the weather?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
  };
  std::vector<std::string> docs;
  size_t total = 0;
  for (int i = 0; total < (1 << 20); ++i) {
    std::string doc;
    while (doc.size() < 4096) doc += pieces[(i + doc.size()) % (sizeof(pieces) / sizeof(pieces[0]))];
    total += doc.size();
    docs.push_back(std::move(doc));
  }
  return docs;
}

const pagellm::Tokenizer& tokenizer() {
  static const pagellm::Tokenizer tok = pagellm::Tokenizer::load(g_model_dir);
  return tok;
}

void BM_Encode(benchmark::State& state) {
  const pagellm::Tokenizer& tok = tokenizer();
  size_t tokens = 0;
  for (auto _ : state) {
    tokens = 0;
    for (const std::string& doc : g_documents) {
      const std::vector<int32_t> ids = tok.encode(doc);
      tokens += ids.size();
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * g_corpus_bytes));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["bytes_per_token"] = static_cast<double>(g_corpus_bytes) / static_cast<double>(tokens);
}

void BM_EncodeColdCache(benchmark::State& state) {
  // Every document once, each through a freshly loaded tokenizer's empty cache: the first
  // pass over unseen text. Loading is excluded.
  for (auto _ : state) {
    state.PauseTiming();
    pagellm::Tokenizer fresh = pagellm::Tokenizer::load(g_model_dir);
    state.ResumeTiming();
    for (const std::string& doc : g_documents) benchmark::DoNotOptimize(fresh.encode(doc).data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * g_corpus_bytes));
}

void BM_Decode(benchmark::State& state) {
  const pagellm::Tokenizer& tok = tokenizer();
  std::vector<std::vector<int32_t>> encoded;
  for (const std::string& doc : g_documents) encoded.push_back(tok.encode(doc));
  for (auto _ : state) {
    for (const auto& ids : encoded) benchmark::DoNotOptimize(tok.decode(ids).data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * g_corpus_bytes));
}

void BM_StreamDecode(benchmark::State& state) {
  const pagellm::Tokenizer& tok = tokenizer();
  std::vector<std::vector<int32_t>> encoded;
  for (const std::string& doc : g_documents) encoded.push_back(tok.encode(doc));
  for (auto _ : state) {
    for (const auto& ids : encoded) {
      pagellm::StreamDecoder stream = tok.stream_decoder();
      for (int32_t id : ids) benchmark::DoNotOptimize(stream.push(id).data());
      benchmark::DoNotOptimize(stream.finish().data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * g_corpus_bytes));
}

void BM_Load(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(pagellm::Tokenizer::load(g_model_dir).vocab_size());
}

}  // namespace

BENCHMARK(BM_Encode)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeColdCache)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StreamDecode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Load)->Unit(benchmark::kMillisecond)->Iterations(3);

int main(int argc, char** argv) {
  std::string corpus;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      g_model_dir = argv[++i];
    } else if (std::strcmp(argv[i], "--corpus") == 0 && i + 1 < argc) {
      corpus = argv[++i];
    } else {
      rest.push_back(argv[i]);
    }
  }
  try {
    if (g_model_dir.empty()) {
      // This file is bench/tokenizer_bench.cpp inside the checkout.
      const std::string source_dir = std::filesystem::path(__FILE__).parent_path().parent_path().string();
      g_model_dir = pagellm::find_qwen3_tokenizer_dir(source_dir);
      if (g_model_dir.empty()) {
        g_model_dir = (std::filesystem::temp_directory_path() / "pagellm-bench-small-tokenizer").string();
        std::filesystem::create_directories(g_model_dir);
        pagellm::write_tokenizer_for_model(g_model_dir, 151936, "");
        std::cerr << "note: Qwen3 tokenizer not found; benchmarking the small built-in tokenizer\n";
      }
    }
    if (corpus.empty()) {
      g_documents = builtin_documents();
    } else {
      std::ifstream in(corpus);
      if (!in) {
        std::cerr << "cannot open " << corpus << "\n";
        return 1;
      }
      std::string line;
      while (std::getline(in, line)) {
        if (!line.empty()) g_documents.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
      }
    }
    for (const std::string& d : g_documents) g_corpus_bytes += d.size();
    std::cerr << "tokenizer: " << g_model_dir << "\ncorpus: " << g_documents.size() << " documents, "
              << g_corpus_bytes << " bytes\n";
    tokenizer();
  } catch (const std::exception& e) {
    std::cerr << "tokenizer_bench: " << e.what() << "\n";
    return 1;
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// TextModel, the text side of a model folder: the vocabulary warning the CLI prints comes
// from check_tokenizer_covers_vocab over the folder's own tokenizer.
#include <gtest/gtest.h>

#include "api/api_test_util.h"
#include "pagellm/api/text_model.h"
#include "pagellm/model/make_model.h"

namespace pagellm {
namespace {

TEST(TextModel, VocabWarningOnlyWhenTheTokenizerDoesNotFitTheRows) {
  const api::TextModel text(testing::tiny_model_dir());
  ASSERT_TRUE(text.has_tokenizer());
  // The made folder's tokenizer fits its own model.
  EXPECT_EQ(text.vocab_warning(preset_config("tiny").vocab_size), "");
  // A model with fewer rows than the tokenizer has ids cannot embed some of them.
  const std::string few_rows = text.vocab_warning(16);
  EXPECT_NE(few_rows.find("16"), std::string::npos) << few_rows;
}

TEST(TextModel, NoTokenizerNoWarning) {
  const api::TextModel text(::testing::TempDir());  // a folder without tokenizer.json
  EXPECT_FALSE(text.has_tokenizer());
  EXPECT_EQ(text.vocab_warning(16), "");
}

}  // namespace
}  // namespace pagellm

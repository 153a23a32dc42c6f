// A deliberate data race, disabled in normal runs: tests/api/tsan.cmake runs it in the
// ThreadSanitizer tree and requires TSan to report it, so a tree that silently lost its
// instrumentation cannot pass the race check.
#include <gtest/gtest.h>

#include <thread>

namespace {

TEST(TsanSelfCheck, DISABLED_DeliberateRace) {
  static int shared = 0;  // written by two threads with no synchronisation
  std::thread a([] {
    for (int i = 0; i < 1000; ++i) shared = shared + 1;
  });
  std::thread b([] {
    for (int i = 0; i < 1000; ++i) shared = shared + 1;
  });
  a.join();
  b.join();
  EXPECT_GT(shared, 0);
}

}  // namespace

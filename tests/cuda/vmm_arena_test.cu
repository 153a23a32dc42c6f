// VmmArena (cuda/vmm_arena.h) must not unmap memory that work in flight still uses.
//
// cuMemUnmap, unlike cudaFree, does not wait for the device. When the last allocation of an
// arena is freed the arena gives every chunk back; if a kernel queued before that free
// still writes the range, the write faults ("an illegal memory access", sticky for the
// whole context). The GPU soak of issue 21 met this as a rare fault in a concurrent
// test_cuda run (a packed copy freed right after its pack kernel was queued, on a GPU slowed
// by another process); compute-sanitizer's memcheck made it happen every time. Here a kernel
// sleeps for ~50 ms on the device before it writes, so that the free certainly comes first;
// the test then checks that the stream finishes cleanly and the kernel's writes happened.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "pagellm/cuda/vmm_arena.h"

namespace pagellm {
namespace {

// Waits ~`ns` nanoseconds of device time, then writes `value` to every element of out.
__global__ void late_write(uint32_t* out, int n, uint32_t value, uint64_t ns, uint32_t* done) {
  uint64_t start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    uint64_t now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns) break;
    __nanosleep(1000);
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = value;
  __syncthreads();
  if (threadIdx.x == 0) *done = 1;
}

struct StreamDeleter {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};

class VmmArenaInFlight : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    stream_.reset(s);
    ASSERT_EQ(cudaMallocManaged(&done_, sizeof(uint32_t)), cudaSuccess);
    *done_ = 0;
  }
  void TearDown() override {
    if (done_ != nullptr) cudaFree(done_);
  }
  // Queues a late write of 1 MiB into `ptr` on the test's own stream (not one the arena
  // knows of).
  void queue_late_write(void* ptr) {
    late_write<<<1, 256, 0, stream_.get()>>>(static_cast<uint32_t*>(ptr), kWords, 0xabcdu,
                                             50'000'000, done_);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  }
  static constexpr int kWords = 1 << 18;
  std::unique_ptr<CUstream_st, StreamDeleter> stream_;
  uint32_t* done_ = nullptr;
};

TEST_F(VmmArenaInFlight, FreeingTheLastAllocationWaitsForWorkInFlight) {
  cuda::VmmArena arena("test arena", "the test GPU");
  void* p = arena.allocate(kWords * sizeof(uint32_t));
  ASSERT_NE(p, nullptr);
  queue_late_write(p);
  arena.deallocate(p);  // the arena empties: every chunk is given back
  EXPECT_EQ(arena.mapped_bytes(), 0u);
  const cudaError_t finished = cudaStreamSynchronize(stream_.get());
  EXPECT_EQ(finished, cudaSuccess) << cudaGetErrorString(finished);
  EXPECT_EQ(*done_, 1u);
  // The arena is usable again afterwards: a new allocation is mapped and writable.
  void* q = arena.allocate(4096);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(cudaMemsetAsync(q, 0x5a, 4096, stream_.get()), cudaSuccess);
  std::vector<unsigned char> back(4096);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), q, 4096, cudaMemcpyDeviceToHost, stream_.get()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  for (unsigned char c : back) ASSERT_EQ(c, 0x5a);
  arena.deallocate(q);
}

TEST_F(VmmArenaInFlight, DestroyingTheArenaWaitsForWorkInFlight) {
  {
    cuda::VmmArena arena("test arena", "the test GPU");
    void* p = arena.allocate(kWords * sizeof(uint32_t));
    ASSERT_NE(p, nullptr);
    queue_late_write(p);
  }  // the arena is destroyed with its allocation live
  const cudaError_t finished = cudaStreamSynchronize(stream_.get());
  EXPECT_EQ(finished, cudaSuccess) << cudaGetErrorString(finished);
  EXPECT_EQ(*done_, 1u);
}

}  // namespace
}  // namespace pagellm

// What the CPU kernels (cpu_products.cc, cpu_attention.cc, cpu_logsumexp.cc) share: 16 float lanes (one AVX-512
// register, or two AVX2 ones, by GCC/Clang vector extensions), bf16 widened exactly as it is read, one fixed
// lane-sum tree (a sum's order never depends on the caller; one vector's or 16 at once), exp of non-positive
// floats, and a parallel loop over XLA's intra-op thread pool.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

namespace carryover {

typedef float v16 __attribute__((vector_size(64)));  // one AVX-512 register, or two AVX2 ones

inline v16 load(const float* p) { v16 v; std::memcpy(&v, p, sizeof v); return v; }
inline v16 load(const uint16_t* p) {  // 16 bf16 (their bits) widened exactly: the bits become a float's top half
  typedef uint16_t u16x16 __attribute__((vector_size(32)));
  typedef uint32_t u32x16 __attribute__((vector_size(64)));
  u16x16 h;
  std::memcpy(&h, p, sizeof h);
  const u32x16 wide = __builtin_convertvector(h, u32x16) << 16;
  v16 v;
  std::memcpy(&v, &wide, sizeof v);
  return v;
}
inline void store(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }
// c + a * b as the vector loops compute it (contracted to one rounding where the CPU has FMA): a scalar tail
// written as `c += a * b` is contracted in some loops and not in others, which would change a row's bits
inline float madd(float a, float b, float c) {
#if defined(__FMA__) || defined(__aarch64__)
  return __builtin_fmaf(a, b, c);
#else
  return c + a * b;
#endif
}
inline float value(float v) { return v; }
inline float value(uint16_t bits) {
  const uint32_t wide = uint32_t(bits) << 16;
  float v;
  std::memcpy(&v, &wide, sizeof v);
  return v;
}

inline float sum(v16 v) {  // a fixed tree: 16 -> 8 -> 4 lanes, then (0 + 2) + (1 + 3)
  typedef float v8 __attribute__((vector_size(32)));
  typedef float v4 __attribute__((vector_size(16)));
  v8 a, b;
  std::memcpy(&a, &v, 32);
  std::memcpy(&b, reinterpret_cast<const char*>(&v) + 32, 32);
  a += b;
  v4 c, d;
  std::memcpy(&c, &a, 16);
  std::memcpy(&d, reinterpret_cast<const char*>(&a) + 16, 16);
  c += d;
  return (c[0] + c[2]) + (c[1] + c[3]);
}

// 16 vectors -> the 16 sums of their lanes in one vector, each by `sum`'s tree (lanes j + j+8, then j + j+4,
// then (0 + 2) + (1 + 3)): a sum is the same taken alone or 16 at once (an attention score whichever path or block
// position computed it, a tied head's y whatever the row count). Each level's shuffles put the lanes `sum` adds side
// by side, so one add serves 2-8 vectors: 45 shuffles and adds for 16 sums, against ~8 a sum.
inline v16 sums16(const v16* a) {
#if defined(__clang__) || __GNUC__ >= 12
  v16 h[8], q[4], e[2];
  for (int i = 0; i < 8; ++i)  // lanes 0-7: a[2i] (j + j+8), lanes 8-15: a[2i+1]
    h[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22,
                                   23) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                   31);
  for (int i = 0; i < 4; ++i)  // 4 lanes per vector: j + j+4
    q[i] = __builtin_shufflevector(h[2 * i], h[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(h[2 * i], h[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)  // 2 lanes per vector: 0 + 2, 1 + 3
    e[i] = __builtin_shufflevector(q[2 * i], q[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(q[2 * i], q[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(e[0], e[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(e[0], e[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#else
  v16 out;
  for (int i = 0; i < 16; ++i) out[i] = sum(a[i]);
  return out;
#endif
}

// sum(acc[i]) for i < kCount into s[i]: from 8 vectors on 16 at a time by `sums16` (the same bits as `sum` one by
// one; SmolLM2's tied head at 8 rows of x took 0.95x the time in float32, 0.87x in bf16, 1-4 rows the same;
// alternated, 2026-12-06, docs/experiments/verify-arithmetic-2026-12-06)
template <int kCount>
inline void sums(const v16* acc, float* s) {
  if constexpr (kCount < 8) {
    for (int i = 0; i < kCount; ++i) s[i] = sum(acc[i]);
    return;
  }
  for (int i0 = 0; i0 < kCount; i0 += 16) {
    v16 a[16] = {};
    for (int i = i0; i < i0 + 16 && i < kCount; ++i) a[i - i0] = acc[i];
    const v16 out = sums16(a);
    for (int i = i0; i < i0 + 16 && i < kCount; ++i) s[i] = out[i - i0];
  }
}

// exp(x) for x <= 0 (a value minus its row's max), Cephes' single-precision polynomial (~1 ulp): x = n ln2 + r,
// |r| <= ln2 / 2, 2^n from the exponent bits; 0 below -87 (where exp would leave the normal floats).
inline v16 exp_nonpositive(v16 x) {
  typedef int32_t i16 __attribute__((vector_size(64)));
  const v16 lo = x < -87.0f ? v16{} - 87.0f : x;  // n >= -126
  const v16 t = lo * 1.44269504088896341f - 0.5f;  // t <= -0.5: truncation rounds t + 0.5 to nearest
  const i16 n = __builtin_convertvector(t, i16);
  const v16 nf = __builtin_convertvector(n, v16);
  v16 r = lo - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  v16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const i16 bits = (n + 127) << 23;
  v16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const v16 e = p * scale;
  return x < -87.0f ? v16{} : e;
}

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// fn(i) for i in [0, n) on the calling thread and up to `workers` - 1 tasks of `pool` (an ffi::ThreadPool).
// Items are claimed from a counter by the caller and the tasks alike, so the loop finishes even when every
// other pool thread is busy; a task that starts after the loop ended finds nothing left and returns (it
// never calls fn, whose captures may be gone).
template <typename Pool, typename Fn>
void parallel_for(Pool& pool, int64_t n, int64_t workers, Fn fn) {
  struct Counters {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto counters = std::make_shared<Counters>();
  auto run = [counters, n, fn] {
    for (int64_t i; (i = counters->next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      fn(i);
      counters->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 1; t < workers && t < n; ++t) pool.Schedule([run] { run(); });
  run();
  while (counters->done.load(std::memory_order_acquire) < n) relax();
}

}  // namespace carryover

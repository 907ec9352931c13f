// A tied head's rows as cpu_products.cc reads them (y[M, N] = x[M, K] . e[N, K]^T, 4 rows of e at a time, N split
// over two threads: the caller and one spinning worker), against variants of the read; SmolLM2's shape [49152, 576],
// two heads read in turn, variants alternated call by call.
//   g++ -O3 -march=native -std=c++17 head_streams.cc -o head -lpthread && ./head ROWS(1|4|8) REPS VARIANT...
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <algorithm>
#include <functional>
typedef float v16 __attribute__((vector_size(64)));
static inline v16 load(const float* p) { v16 v; std::memcpy(&v, p, 64); return v; }
static inline float hsum(v16 v) { float s = 0; for (int i = 0; i < 16; ++i) s += v[i]; return s; }
template <int M, int R, int AHEAD, int HINT>
static inline void block(const float* x, const float* e, float* y, int64_t K, int64_t N, int64_t n, bool ahead) {
  v16 acc[R][M] = {};
  for (int64_t k = 0; k < K; k += 16) {
    if (ahead) for (int r = 0; r < R; ++r) __builtin_prefetch(e + (n + AHEAD + r) * K + k, 0, HINT);
    v16 ev[R];
    for (int r = 0; r < R; ++r) ev[r] = load(e + (n + r) * K + k);
    for (int m = 0; m < M; ++m) { const v16 xv = load(x + m * K + k); for (int r = 0; r < R; ++r) acc[r][m] += xv * ev[r]; }
  }
  for (int r = 0; r < R; ++r) for (int m = 0; m < M; ++m) y[m * N + n + r] = hsum(acc[r][m]);
}
// variant 0: rows in order, 4 ahead (the kernel); 1: 8 ahead; 2: two interleaved streams (halves of the range);
// 3: 4 ahead, NTA hint; 4: no software prefetch
template <int M, int V>
static void rows(const float* x, const float* e, float* y, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  constexpr int R = 4;
  if constexpr (V == 2) {
    int64_t h = n0 + (n1 - n0) / 2 / R * R;
    int64_t a = n0, b = h;
    for (; a + R <= h && b + R <= n1; a += R, b += R) {
      block<M, R, 4, 3>(x, e, y, K, N, a, a + 8 <= h);
      block<M, R, 4, 3>(x, e, y, K, N, b, b + 8 <= n1);
    }
    for (; a + R <= h; a += R) block<M, R, 4, 3>(x, e, y, K, N, a, false);
    for (; b + R <= n1; b += R) block<M, R, 4, 3>(x, e, y, K, N, b, false);
  } else {
    constexpr int A = V == 1 ? 8 : 4; constexpr int H = V == 3 ? 0 : 3;
    for (int64_t n = n0; n + R <= n1; n += R) block<M, R, A, H>(x, e, y, K, N, n, V != 4 && n + A + R <= n1);
  }
}
typedef void (*Fn)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
static std::atomic<int64_t> g_gen{0}, g_done{0}; static std::function<void()> g_job;
static void worker() { int64_t seen = 0; for (;;) { int64_t g; while ((g = g_gen.load(std::memory_order_acquire)) == seen) __builtin_ia32_pause(); if (g < 0) return; seen = g; g_job(); g_done.fetch_add(1, std::memory_order_release); } }
template <int M> struct Tab { static constexpr Fn f[5] = {rows<M, 0>, rows<M, 1>, rows<M, 2>, rows<M, 3>, rows<M, 4>}; };
int main(int argc, char** argv) {
  int M = atoi(argv[1]), reps = atoi(argv[2]); int nv = argc - 3; std::vector<int> vs; for (int i = 3; i < argc; ++i) vs.push_back(atoi(argv[i]));
  const int64_t K = 576, N = 49152; const int H = 2;
  std::vector<float*> es; for (int h = 0; h < H; ++h) { float* e = (float*)aligned_alloc(64, 4 * K * N); for (int64_t i = 0; i < K * N; ++i) e[i] = (i % 977) / 977.f - 0.5f; es.push_back(e); }
  std::vector<float> x(8 * K), y(8 * N); for (auto& v : x) v = (rand() % 100) / 100.f;
  std::thread t(worker); int64_t gen = 0;
  std::vector<std::vector<double>> tt(nv);
  for (int r = 0; r < reps; ++r) for (int i = 0; i < nv; ++i) for (int h = 0; h < H; ++h) {
    Fn f = M == 1 ? Tab<1>::f[vs[i]] : M == 4 ? Tab<4>::f[vs[i]] : Tab<8>::f[vs[i]];
    const float* e = es[h]; int64_t half = N / 2;
    auto t0 = std::chrono::steady_clock::now();
    g_job = [&, f, e, half] { f(x.data(), e, y.data(), K, N, half, N); };
    g_gen.store(++gen, std::memory_order_release);
    f(x.data(), e, y.data(), K, N, 0, half);
    while (g_done.load(std::memory_order_acquire) < gen) __builtin_ia32_pause();
    tt[i].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  g_gen.store(-1); t.join();
  for (int i = 0; i < nv; ++i) { std::sort(tt[i].begin(), tt[i].end()); printf("M=%d variant %d: %.3f ms (min %.3f)\n", M, vs[i], tt[i][tt[i].size() / 2], tt[i][0]); }
}

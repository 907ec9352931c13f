// Few-row K-split products as cpu_products.cc runs them (row-major w, 8 rows a block, the next block prefetched),
// against w packed at load time as [K/8][N/16][8][16] (each block of 8 rows x 16 columns one contiguous 512 bytes):
// SmolLM2's 30 layers' Dense shapes (425 MB), two threads (the caller and one spinning worker, each half of K),
// the two layouts alternated rep by rep.   g++ -O3 -march=native -std=c++17 packed_layout.cc -o packed -lpthread
// ./packed ROWS REPS
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
static inline void store(float* p, v16 v) { std::memcpy(p, &v, 64); }
constexpr int kB = 8;
template <int M> void acc_row(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t k0, int64_t k1) {
  std::memset(y, 0, 4 * M * N);
  for (int64_t k = k0; k + kB <= k1; k += kB) {
    float b[M][kB];
    for (int m = 0; m < M; ++m) for (int j = 0; j < kB; ++j) b[m][j] = x[m * K + k + j];
    const bool ahead = k + 2 * kB <= k1;
    for (int64_t n = 0; n + 16 <= N; n += 16) {
      if (ahead) for (int j = 0; j < kB; ++j) __builtin_prefetch(w + (k + kB + j) * N + n);
      v16 wv[kB];
      for (int j = 0; j < kB; ++j) wv[j] = load(w + (k + j) * N + n);
      for (int m = 0; m < M; ++m) { v16 a = load(y + m * N + n); for (int j = 0; j < kB; ++j) a += b[m][j] * wv[j]; store(y + m * N + n, a); }
    }
  }
}
template <int M> void acc_pack(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t k0, int64_t k1) {
  std::memset(y, 0, 4 * M * N);
  const int64_t NB = N / 16;
  for (int64_t k = k0; k + kB <= k1; k += kB) {
    float b[M][kB];
    for (int m = 0; m < M; ++m) for (int j = 0; j < kB; ++j) b[m][j] = x[m * K + k + j];
    const bool ahead = k + 2 * kB <= k1;
    const float* blk = w + (k / kB) * NB * kB * 16;
    for (int64_t nb = 0; nb < NB; ++nb) {
      const float* p = blk + nb * kB * 16;
      if (ahead) for (int j = 0; j < kB; ++j) __builtin_prefetch(p + N * kB + j * 16);
      v16 wv[kB];
      for (int j = 0; j < kB; ++j) wv[j] = load(p + j * 16);
      for (int m = 0; m < M; ++m) { v16 a = load(y + m * N + nb * 16); for (int j = 0; j < kB; ++j) a += b[m][j] * wv[j]; store(y + m * N + nb * 16, a); }
    }
  }
}
typedef void (*Fn)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
#include <functional>
static std::atomic<int64_t> g_gen{0}, g_done{0}; static std::function<void()> g_job;
static void worker() { int64_t seen = 0; for (;;) { int64_t g; while ((g = g_gen.load(std::memory_order_acquire)) == seen) __builtin_ia32_pause(); if (g < 0) return; seen = g; g_job(); g_done.fetch_add(1, std::memory_order_release); } }
int main(int argc, char** argv) {
  int M = atoi(argv[1]); int reps = atoi(argv[2]);
  struct Sh { int64_t K, N; const char* name; };
  std::vector<Sh> sh = {{576, 576, "q"}, {576, 192, "k"}, {576, 192, "v"}, {576, 576, "o"}, {576, 1536, "gate"}, {576, 1536, "up"}, {1536, 576, "down"}};
  int L = 30; std::vector<float*> wr, wp; srand(1);
  for (int l = 0; l < L; ++l) for (auto& s : sh) {
    float* a = (float*)aligned_alloc(64, 4 * s.K * s.N); float* p = (float*)aligned_alloc(64, 4 * s.K * s.N);
    for (int64_t i = 0; i < s.K * s.N; ++i) a[i] = (rand() % 1000) / 1000.f - 0.5f;
    int64_t NB = s.N / 16;
    for (int64_t kb = 0; kb < s.K / 8; ++kb) for (int64_t nb = 0; nb < NB; ++nb) for (int j = 0; j < 8; ++j) for (int l2 = 0; l2 < 16; ++l2)
      p[((kb * NB + nb) * 8 + j) * 16 + l2] = a[(kb * 8 + j) * s.N + nb * 16 + l2];
    wr.push_back(a); wp.push_back(p);
  }
  std::vector<float> x(8 * 1536), y(8 * 1536), part(8 * 1536), yp(8 * 1536);
  for (auto& v : x) v = (rand() % 1000) / 1000.f;
  Fn fr[] = {acc_row<1>, acc_row<2>, acc_row<3>, acc_row<4>}, fp[] = {acc_pack<1>, acc_pack<2>, acc_pack<3>, acc_pack<4>};
  std::thread t(worker);
  int64_t gen = 0;
  auto prod = [&](Fn f, const float* w, int64_t K, int64_t N) {
    int64_t half = K / 2 / 8 * 8;
    g_job = [&, f, w, K, N, half] { f(x.data(), w, part.data(), K, N, half, K); };
    g_gen.store(++gen, std::memory_order_release);
    f(x.data(), w, y.data(), K, N, 0, half);
    while (g_done.load(std::memory_order_acquire) < gen) __builtin_ia32_pause();
    for (int64_t i = 0; i < M * N; ++i) y[i] += part[i];
  };
  std::vector<std::vector<double>> tr(7), tp(7);
  double check = 0;
  for (int r = 0; r < reps; ++r) for (int arm = 0; arm < 2; ++arm) {
    auto& tt = arm ? tp : tr; auto& ws = arm ? wp : wr; Fn f = (arm ? fp : fr)[M - 1];
    std::vector<double> acc(7, 0);
    for (int l = 0; l < L; ++l) for (int s = 0; s < 7; ++s) {
      auto t0 = std::chrono::steady_clock::now(); prod(f, ws[l * 7 + s], sh[s].K, sh[s].N);
      acc[s] += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      check += arm ? -y[5] : y[5];
    }
    for (int s = 0; s < 7; ++s) tt[s].push_back(acc[s]);
  }
  g_gen.store(-1); t.join();
  printf("M=%d  (ms per 30 layers, median)  check %g\n", M, check);
  double sr = 0, sp = 0;
  for (int s = 0; s < 7; ++s) { std::sort(tr[s].begin(), tr[s].end()); std::sort(tp[s].begin(), tp[s].end());
    double a = tr[s][reps / 2] / 1e3, b = tp[s][reps / 2] / 1e3; sr += a; sp += b;
    printf("%5s row-major %.3f packed %.3f  ratio %.3f\n", sh[s].name, a, b, b / a); }
  printf("  all row-major %.3f packed %.3f ratio %.3f\n", sr, sp, sp / sr);
}

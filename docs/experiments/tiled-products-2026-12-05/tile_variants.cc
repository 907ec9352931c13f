// y[M, N] = x[M, K] . w[K, N] for M ~ 16-256 without packing w: register tiles of MR rows x NV vectors over panels of KC
// rows of w, the next panel prefetched (HINT: 3 into L1, 2 into L2, -1 none; PF 0 by the first row tile, 1 spread
// over the row tiles, 2 spread and two panels ahead), the columns split over 2 threads (the caller and a spinning
// worker); SmolLM2's 30 layers' Dense shapes. Edit `fns` / `NVs` for the variants.
//   g++ -O3 -march=native -std=c++17 tile_variants.cc -o gemm -lpthread && ./gemm M REPS
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
template <int MR, int NV, int HINT>
static inline void tile(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t m0, int64_t n, int64_t k0, int64_t k1, bool first, const float* pf, int64_t pstep = 1, int64_t poff = 0) {
  v16 acc[MR][NV];
  for (int m = 0; m < MR; ++m) for (int j = 0; j < NV; ++j) acc[m][j] = first ? v16{} : load(y + (m0 + m) * N + n + 16 * j);
  for (int64_t k = k0; k < k1; ++k) {
    const float* wr = w + k * N + n;
    if (pf && (k - k0) % pstep == poff) for (int64_t kk = k - k0; kk < k - k0 + pstep && kk < k1 - k0; ++kk) for (int j = 0; j < NV; ++j) __builtin_prefetch(pf + kk * N + 16 * j, 0, HINT);
    v16 wv[NV];
    for (int j = 0; j < NV; ++j) wv[j] = load(wr + 16 * j);
    for (int m = 0; m < MR; ++m) { float b = x[(m0 + m) * K + k]; for (int j = 0; j < NV; ++j) acc[m][j] += b * wv[j]; }
  }
  for (int m = 0; m < MR; ++m) for (int j = 0; j < NV; ++j) store(y + (m0 + m) * N + n + 16 * j, acc[m][j]);
}
template <int MR, int NV, int KC, int HINT, int PF>
static void gemm(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  const int64_t blocks = M / MR;
  for (int64_t n = n0; n < n1; n += 16 * NV)
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      int64_t k1 = std::min<int64_t>(K, k0 + KC);
      const int64_t ahead = PF == 2 ? 2 : 1;
      int64_t nk = k0 + ahead * KC, nn = n;
      while (nk >= K) { nk -= K; nn += 16 * NV; }
      const float* pf = nn < n1 ? w + nk * N + nn : nullptr;
      int64_t m = 0, bi = 0;
      for (; m + MR <= M; m += MR, ++bi) {
        if (PF == 0) tile<MR, NV, HINT>(x, w, y, K, N, m, n, k0, k1, k0 == 0, m == 0 ? pf : nullptr);
        else tile<MR, NV, HINT>(x, w, y, K, N, m, n, k0, k1, k0 == 0, pf, blocks, bi);
      }
      for (; m < M; ++m) tile<1, NV, HINT>(x, w, y, K, N, m, n, k0, k1, k0 == 0, nullptr);
    }
}
typedef void (*Fn)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);
static std::atomic<int64_t> g_gen{0}, g_done{0}; static std::function<void()> g_job;
static void worker() { int64_t seen = 0; for (;;) { int64_t g; while ((g = g_gen.load(std::memory_order_acquire)) == seen) __builtin_ia32_pause(); if (g < 0) return; seen = g; g_job(); g_done.fetch_add(1, std::memory_order_release); } }
int main(int argc, char** argv) {
  int64_t M = atoi(argv[1]); int reps = atoi(argv[2]);
  struct Sh { int64_t K, N; };
  std::vector<Sh> sh = {{576, 576}, {576, 192}, {576, 192}, {576, 576}, {576, 1536}, {576, 1536}, {1536, 576}};
  int L = 30; std::vector<float*> ws;
  for (int l = 0; l < L; ++l) for (auto& s : sh) { float* a = (float*)aligned_alloc(64, 4 * s.K * s.N); for (int64_t i = 0; i < s.K * s.N; ++i) a[i] = (i % 991) / 991.f - 0.5f; ws.push_back(a); }
  std::vector<float> x(M * 1536), y(M * 1536); for (auto& v : x) v = (rand() % 100) / 100.f;
  Fn fns[] = {gemm<4, 6, 96, 2, 0>, gemm<4, 6, 96, 2, 1>, gemm<4, 6, 96, 2, 2>, gemm<4, 6, 96, 3, 1>};
  const int NVs[] = {6, 6, 6, 6};
  std::thread t(worker); int64_t gen = 0;
  double flops = 0; for (auto& s : sh) flops += 2.0 * M * s.K * s.N * L;
  for (int v = 0; v < 4; ++v) {
    std::vector<double> tt;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int l = 0; l < L; ++l) for (int s = 0; s < 7; ++s) {
        const float* w = ws[l * 7 + s]; int64_t K = sh[s].K, N = sh[s].N, half = N / (16 * NVs[v]) / 2 * (16 * NVs[v]); Fn f = fns[v];
        g_job = [&, f, w, K, N, half] { f(x.data(), w, y.data(), M, K, N, half, N); };
        g_gen.store(++gen, std::memory_order_release);
        f(x.data(), w, y.data(), M, K, N, 0, half);
        while (g_done.load(std::memory_order_acquire) < gen) __builtin_ia32_pause();
      }
      tt.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(tt.begin(), tt.end());
    printf("M=%ld KC variant %d: %.2f ms per 30 layers, %.0f GFLOP/s\n", M, v, tt[reps / 2] * 1e3, flops / tt[reps / 2] / 1e9);
  }
  g_gen.store(-1); t.join();
}

// The first sketch of the bf16 tiles by vdpbf16ps, outside XLA: y[M, N] = x[M, K] . w[K, N], x and w bf16 (bits), y
// float32, SmolLM2's 30 layers' Dense shapes, the columns split over 2 threads (the caller and a spinning worker).
// First checks the instruction's arithmetic on this CPU against a scalar emulation of both pair orders, then times
// tile variants (MR rows x NG groups of 32 columns, KC rows of w a panel).
//   g++ -O3 -march=native -std=c++17 pairs_standalone.cc -o pairs -lpthread && ./pairs M REPS
#include <immintrin.h>
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
typedef uint16_t bf;
static inline float tof(bf b){uint32_t u=uint32_t(b)<<16; float f; memcpy(&f,&u,4); return f;}
static inline bf tobf(float f){uint32_t u; memcpy(&u,&f,4); return bf((u+0x7fff+((u>>16)&1))>>16);}
// pairs of rows k, k+1 of 32 columns -> lo: columns {0-3,8-11,16-19,24-27}, hi: {4-7,...}
template <int MR, int NG>
static inline void tile(const bf* x, const bf* w, float* y, int64_t K, int64_t N, int64_t m0, int64_t n, int64_t k0, int64_t k1, bool first, const bf* pf) {
  __m512 acc[MR][2 * NG];
  for (int m = 0; m < MR; ++m) for (int j = 0; j < 2 * NG; ++j) acc[m][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + (m0 + m) * N + n + 16 * j);
  for (int64_t k = k0; k < k1; k += 2) {
    if (pf) for (int g = 0; g < NG; ++g) { __builtin_prefetch(pf + (k - k0) * N + 32 * g, 0, 2); __builtin_prefetch(pf + (k - k0 + 1) * N + 32 * g, 0, 2); }
    __m512i xb[MR];
    for (int m = 0; m < MR; ++m) { uint32_t p; memcpy(&p, x + (m0 + m) * K + k, 4); xb[m] = _mm512_set1_epi32(p); }
    for (int g = 0; g < NG; ++g) {
      __m512i a = _mm512_loadu_si512(w + k * N + n + 32 * g), b = _mm512_loadu_si512(w + (k + 1) * N + n + 32 * g);
      __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
      for (int m = 0; m < MR; ++m) {
        acc[m][2 * g] = _mm512_dpbf16_ps(acc[m][2 * g], (__m512bh)xb[m], (__m512bh)lo);
        acc[m][2 * g + 1] = _mm512_dpbf16_ps(acc[m][2 * g + 1], (__m512bh)xb[m], (__m512bh)hi);
      }
    }
  }
  for (int m = 0; m < MR; ++m) for (int j = 0; j < 2 * NG; ++j) _mm512_storeu_ps(y + (m0 + m) * N + n + 16 * j, acc[m][j]);
}
template <int MR, int NG, int KC>
static void gemm(const bf* x, const bf* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += 32 * NG)
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      int64_t k1 = std::min<int64_t>(K, k0 + KC);
      int64_t nk = k0 + KC, nn = n; if (nk >= K) { nk = 0; nn += 32 * NG; }
      const bf* pf = nn < n1 ? w + nk * N + nn : nullptr;
      int64_t m = 0;
      for (; m + MR <= M; m += MR) tile<MR, NG>(x, w, y, K, N, m, n, k0, k1, k0 == 0, m == 0 ? pf : nullptr);
      for (; m < M; ++m) tile<1, NG>(x, w, y, K, N, m, n, k0, k1, k0 == 0, nullptr);
    }
}
typedef void (*Fn)(const bf*, const bf*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);
static std::atomic<int64_t> g_gen{0}, g_done{0}; static std::function<void()> g_job;
static void worker() { int64_t seen = 0; for (;;) { int64_t g; while ((g = g_gen.load(std::memory_order_acquire)) == seen) __builtin_ia32_pause(); if (g < 0) return; seen = g; g_job(); g_done.fetch_add(1, std::memory_order_release); } }
int main(int argc, char** argv) {
  int64_t M = atoi(argv[1]); int reps = atoi(argv[2]);
  struct Sh { int64_t K, N; };
  std::vector<Sh> sh = {{576, 576}, {576, 192}, {576, 192}, {576, 576}, {576, 1536}, {576, 1536}, {1536, 576}};
  int L = 30; std::vector<bf*> ws;
  for (int l = 0; l < L; ++l) for (auto& s : sh) { bf* a = (bf*)aligned_alloc(64, 2 * s.K * s.N); for (int64_t i = 0; i < s.K * s.N; ++i) a[i] = tobf((i % 991) / 991.f - 0.5f); ws.push_back(a); }
  std::vector<bf> x(M * 1536); std::vector<float> y(M * 1536); for (auto& v : x) v = tobf((rand() % 1000) / 1000.f - 0.3f);
  // check against a scalar emulation: acc + x1 w1, then + x0 w0
  { int64_t K = 576, N = 192; bf* w = ws[1]; gemm<4, 3, 96>(x.data(), w, y.data(), M, K, N, 0, N); int bad = 0, bad2 = 0;
    for (int64_t m = 0; m < M; ++m) for (int64_t c = 0; c < N; ++c) { int64_t g = c / 32, r = c % 32, lane8 = r / 8, pos = r % 8; int64_t j = 2 * g + (pos >= 4), lane = lane8 * 4 + pos % 4;
      float a = 0, b2 = 0; for (int64_t k = 0; k < K; k += 2) { a = a + tof(x[m*K+k+1]) * tof(w[(k+1)*N+c]); a = a + tof(x[m*K+k]) * tof(w[k*N+c]); b2 = b2 + tof(x[m*K+k]) * tof(w[k*N+c]); b2 = b2 + tof(x[m*K+k+1]) * tof(w[(k+1)*N+c]); }
      float got = y[m * N + 16 * j + lane]; if (memcmp(&got, &a, 4)) ++bad; if (memcmp(&got, &b2, 4)) ++bad2; }
    printf("vs emulation odd-first: %d of %ld differ; even-first: %d\n", bad, M * N, bad2); }
  Fn fns[] = {gemm<4, 3, 96>, gemm<4, 2, 96>, gemm<6, 2, 96>, gemm<8, 1, 96>, gemm<4, 3, 192>, gemm<4, 3, 48>};
  const int NGs[] = {3, 2, 2, 1, 3, 3};
  std::thread t(worker); int64_t gen = 0;
  double flops = 0; for (auto& s : sh) flops += 2.0 * M * s.K * s.N * L;
  for (int v = 0; v < 6; ++v) {
    std::vector<double> tt;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int l = 0; l < L; ++l) for (int s = 0; s < 7; ++s) {
        const bf* w = ws[l * 7 + s]; int64_t K = sh[s].K, N = sh[s].N, tw = 32 * NGs[v], half = (N / tw + 1) / 2 * tw; if (half > N) half = N; Fn f = fns[v];
        g_job = [&, f, w, K, N, half] { f(x.data(), w, y.data(), M, K, N, half, N); };
        g_gen.store(++gen, std::memory_order_release);
        f(x.data(), w, y.data(), M, K, N, 0, half);
        while (g_done.load(std::memory_order_acquire) < gen) __builtin_ia32_pause();
      }
      tt.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(tt.begin(), tt.end());
    printf("M=%ld variant %d: %.2f ms per 30 layers, %.0f GFLOP/s\n", M, v, tt[reps / 2] * 1e3, flops / tt[reps / 2] / 1e9);
  }
  g_gen.store(-1); t.join();
}

// bf16 products of more rows than `cpu_products.cc` takes (a batched decode step: one row per sequence) on CPUs
// with AVX512-BF16: y[M, N] = x[M, K] . w[K, N], bf16 operands, float32 result, by VDPBF16PS (each instruction
// 16 columns x one pair of k: exact bf16 products, float32 sums).
//
// Why: XLA CPU's bf16 products of 64 rows reach 230-340 GFLOP/s on SmolLM2's layer shapes, against ~410 at
// 2,048 rows (two Zen 4 cores), because it packs the whole weight matrix and splits the work for large M.
// Here each task packs one 64-column panel of w, 256 k at a time, into the VDPBF16PS pair layout in L1
// (interleaving rows k and k + 1), and runs every row block of its range over it: 6 rows x 64 columns of
// float32 accumulators in registers, x broadcast a pair of k at a time.
//
// Every y[m, n] is the same sequence of VDPBF16PS steps over k pairs (0, 1), (2, 3), ... from 0 whatever M, the
// row block or the thread split is: a row's products do not depend on the other rows of the batch. Where the
// compiler does not target AVX512-BF16 the handler refuses, and `CarryoverCpuGemmBuilt` says so
// (`cpu_products.py` calls it only where the build has it).
#include <cstdint>
#include <cstring>

#include "cpu_common.h"
#include "xla/ffi/api/ffi.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define CARRYOVER_GEMM 1
#endif

namespace ffi = xla::ffi;

namespace {

using namespace carryover;

#ifdef CARRYOVER_GEMM
constexpr int kPanel = 64;    // columns of w per task: 4 vectors of 16
constexpr int kDepth = 256;   // k per packed block: 128 pairs x 64 columns x 4 bytes = 32 KiB, L1
constexpr int kRowsTile = 6;  // rows of x per register tile: 6 x 4 accumulators

// pairs [p0, p0 + np) of rows (2p, 2p + 1) of w, columns [n0, n0 + 64) -> buf[p][j][16 columns x 2]; rows >= K
// and columns >= N are zeros
void pack(const uint16_t* w, int64_t K, int64_t N, int64_t k0, int64_t np, int64_t n0, uint16_t* buf) {
  alignas(64) static const uint16_t lo_idx[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                  8,  40, 9,  41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const uint16_t hi_idx[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                  24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
  const int64_t cols = N - n0 < kPanel ? N - n0 : kPanel;
  const __mmask32 m0 = cols >= 32 ? ~__mmask32(0) : (__mmask32(1) << cols) - 1;
  const __mmask32 m1 = cols >= 64 ? ~__mmask32(0) : cols <= 32 ? 0 : (__mmask32(1) << (cols - 32)) - 1;
  for (int64_t p = 0; p < np; ++p) {
    const int64_t k = k0 + 2 * p;
    const uint16_t* a = w + k * N + n0;
    const uint16_t* b = a + N;
    const bool has_b = k + 1 < K;
    for (int h = 0; h < 2; ++h) {  // columns 0-31, then 32-63
      const __mmask32 mask = h == 0 ? m0 : m1;
      const __m512i va = _mm512_maskz_loadu_epi16(mask, a + 32 * h);
      const __m512i vb = has_b ? _mm512_maskz_loadu_epi16(mask, b + 32 * h) : _mm512_setzero_si512();
      _mm512_store_si512(buf + (p * 4 + 2 * h) * 32, _mm512_permutex2var_epi16(va, lo, vb));
      _mm512_store_si512(buf + (p * 4 + 2 * h + 1) * 32, _mm512_permutex2var_epi16(va, hi, vb));
    }
  }
}

// y[0:R, n0:n0+64] (+)= x[0:R, k0:k0+2np] . the packed panel; `first`: start from 0 (else from y)
template <int R>
void tile(const uint16_t* x, int64_t K, int64_t k0, int64_t np, const uint16_t* buf, float* y, int64_t N,
          int64_t n0, bool first, const uint16_t* next) {
  const int64_t cols = N - n0 < kPanel ? N - n0 : kPanel;
  __mmask16 mask[4];
  for (int j = 0; j < 4; ++j) {
    const int64_t c = cols - 16 * j;
    mask[j] = c >= 16 ? __mmask16(0xFFFF) : c <= 0 ? __mmask16(0) : __mmask16((1u << c) - 1);
  }
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j)
      acc[r][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[j], y + r * N + n0 + 16 * j);
  const bool odd_tail = k0 + 2 * np > K;  // the last pair's second k is past K: x's is read as 0
  const int64_t full = odd_tail ? np - 1 : np;
  for (int64_t p = 0; p < full; ++p) {
    if (next != nullptr) {  // the next block's rows 2p, 2p + 1 of this panel (two cache lines each)
      __builtin_prefetch(next + 2 * p * N);
      __builtin_prefetch(next + 2 * p * N + 32);
      __builtin_prefetch(next + (2 * p + 1) * N);
      __builtin_prefetch(next + (2 * p + 1) * N + 32);
    }
    const __m512bh w0 = (__m512bh)_mm512_load_si512(buf + (p * 4 + 0) * 32);
    const __m512bh w1 = (__m512bh)_mm512_load_si512(buf + (p * 4 + 1) * 32);
    const __m512bh w2 = (__m512bh)_mm512_load_si512(buf + (p * 4 + 2) * 32);
    const __m512bh w3 = (__m512bh)_mm512_load_si512(buf + (p * 4 + 3) * 32);
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * K + k0 + 2 * p, sizeof pair);
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xb, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xb, w1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], xb, w2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], xb, w3);
    }
  }
  if (odd_tail) {
    const int64_t p = np - 1;
    for (int r = 0; r < R; ++r) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(int32_t(x[r * K + k0 + 2 * p]));
      for (int j = 0; j < 4; ++j)
        acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xb, (__m512bh)_mm512_load_si512(buf + (p * 4 + j) * 32));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) _mm512_mask_storeu_ps(y + r * N + n0 + 16 * j, mask[j], acc[r][j]);
}

using TileFn = void (*)(const uint16_t*, int64_t, int64_t, int64_t, const uint16_t*, float*, int64_t, int64_t, bool,
                        const uint16_t*);
constexpr TileFn kTiles[kRowsTile] = {tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

// rows [m0, m1) x the panel at n0, every k
void task(const uint16_t* x, const uint16_t* w, float* y, int64_t K, int64_t N, int64_t m0, int64_t m1, int64_t n0) {
  alignas(64) thread_local uint16_t buf[kDepth / 2 * kPanel * 2];
  for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
    const int64_t kc = K - k0 < kDepth ? K - k0 : kDepth, np = (kc + 1) / 2;
    pack(w, K, N, k0, np, n0, buf);
    for (int64_t m = m0; m < m1; m += kRowsTile) {
      const int64_t r = m1 - m < kRowsTile ? m1 - m : kRowsTile;
      const bool ahead = m == m0 && k0 + kDepth < K;  // the first row tile prefetches the next block of w
      kTiles[r - 1](x + m * K, K, k0, np, buf, y + m * N, N, n0, k0 == 0,
                    ahead ? w + (k0 + kDepth) * N + n0 : nullptr);
    }
  }
}
#endif

ffi::Error Gemm(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> w,
                ffi::ResultBuffer<ffi::F32> y) {
#ifdef CARRYOVER_GEMM
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 2 || yd.size() != 2)
    return ffi::Error::InvalidArgument("cpu_gemm: x, w and y must be 2-D");
  const int64_t M = xd[0], K = xd[1], N = wd[1];
  if (wd[0] != K || yd[0] != M || yd[1] != N)
    return ffi::Error::InvalidArgument("cpu_gemm: shapes do not match x[M, K] . w[K, N] = y[M, N]");
  float* out = y->typed_data();
  if (K == 0) {
    std::memset(out, 0, sizeof(float) * M * N);
    return ffi::Error::Success();
  }
  const auto* xs = reinterpret_cast<const uint16_t*>(x.typed_data());
  const auto* ws = reinterpret_cast<const uint16_t*>(w.typed_data());
  // tasks: panels x row blocks, at least 8 per thread where the rows allow (each row block packs its panels again)
  const int64_t threads = pool.num_threads() < 1 ? 1 : pool.num_threads();
  const int64_t panels = (N + kPanel - 1) / kPanel, tiles = (M + kRowsTile - 1) / kRowsTile;
  int64_t blocks = (8 * threads + panels - 1) / panels;
  blocks = blocks < 1 ? 1 : blocks > tiles ? tiles : blocks;
  const int64_t rows = (tiles + blocks - 1) / blocks * kRowsTile;
  blocks = (M + rows - 1) / rows;
  parallel_for(pool, panels * blocks, threads, [=](int64_t t) {
    const int64_t b = t % blocks, m0 = b * rows, m1 = m0 + rows < M ? m0 + rows : M;
    task(xs, ws, out, K, N, m0, m1, (t / blocks) * kPanel);
  });
  return ffi::Error::Success();
#else
  return ffi::Error(ffi::ErrorCode::kUnimplemented, "cpu_gemm: built without AVX512-BF16");
#endif
}

}  // namespace

// 1 where this build computes (the CPU and the compiler have AVX512-BF16), else 0: the handler refuses
extern "C" int CarryoverCpuGemmBuilt() {
#ifdef CARRYOVER_GEMM
  return 1;
#else
  return 0;
#endif
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuGemmBf16, Gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

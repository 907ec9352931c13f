// Few-row products on the CPU for M <= 8 rows (a decode step: an AR step at batch 1 is 1 row, a verification
// of P + 1 tokens P + 1 rows), float32 or bf16 operands, float32 products, sums and result:
// y[M, N] = x[M, K] . w[K, N] (a Dense layer's kernel) and y[M, N] = x[M, K] . e[N, K]^T (a tied LM head's
// [V, d] embedding: each y[m, n] one row of e against x[m]).
//
// Why: XLA CPU runs a one-row product as a matrix-vector kernel that streams the weights at the memory's
// rate, but 2-8 rows as a matrix-matrix kernel that streams them ~1.5-2x slower, so verifying 4 tokens cost
// ~1.3 AR steps where the bandwidth bound says ~1.0. Here every row reads each weight once, in memory order:
// for w [K, N] the K rows are split into contiguous chunks (one per thread of XLA's intra-op pool), each
// chunk's rows read 4 at a time with software prefetch, and the chunks' partial y summed in chunk order; for
// e [N, K] the N rows are split into contiguous chunks and each row is read once against all M rows of x.
//
// Every y[m, n] is computed by the same operations in the same order whatever M is (rows never mix), so a
// token's products in a P + 1-row verification equal, bit for bit, its products in a one-row AR step.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

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

constexpr int kMaxRows = 8;
constexpr int kBlock = 4;        // rows of w read together
constexpr int kPrefetch = 8;     // rows of w ahead
constexpr int64_t kReuseBytes = 128 << 10;  // rows 5-8 re-read a slice of w this size from L2

// y[0:M, :] += x[0:M, k0:k1] . w[k0:k1, :], M <= 4 (all M broadcasts of a 4-row block stay in registers).
// W: float, or uint16_t for bf16 weights (widened to float as they are read; float32 products and sums).
template <typename W, int M>
void accumulate(const float* x, const W* w, float* y, int64_t K, int64_t N, int64_t k0, int64_t k1) {
  int64_t k = k0;
  for (; k + kBlock <= k1; k += kBlock) {
    float b[M][kBlock];
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < kBlock; ++j) b[m][j] = x[m * K + k + j];
    const bool ahead = k + kPrefetch + kBlock <= k1;
    int64_t n = 0;
    for (; n + 16 <= N; n += 16) {
      if (ahead)
        for (int j = 0; j < kBlock; ++j) __builtin_prefetch(w + (k + kPrefetch + j) * N + n);
      v16 wv[kBlock];
      for (int j = 0; j < kBlock; ++j) wv[j] = load(w + (k + j) * N + n);
      for (int m = 0; m < M; ++m) {
        v16 acc = load(y + m * N + n);
        for (int j = 0; j < kBlock; ++j) acc += b[m][j] * wv[j];
        store(y + m * N + n, acc);
      }
    }
    for (; n < N; ++n)
      for (int m = 0; m < M; ++m) {
        float acc = y[m * N + n];
        for (int j = 0; j < kBlock; ++j) acc += b[m][j] * value(w[(k + j) * N + n]);
        y[m * N + n] = acc;
      }
  }
  for (; k < k1; ++k)
    for (int m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * N + n] += x[m * K + k] * value(w[k * N + n]);
}

// y = x[:, k0:k1] . w[k0:k1, :] for M <= 8: rows 5-8 run over each L2-sized slice of w right after rows 1-4.
template <typename W, int M>
void chunk(const float* x, const W* w, float* y, int64_t K, int64_t N, int64_t k0, int64_t k1) {
  std::memset(y, 0, sizeof(float) * M * N);
  if constexpr (M <= 4) {
    accumulate<W, M>(x, w, y, K, N, k0, k1);
  } else {
    int64_t step = kReuseBytes / (sizeof(W) * N) / kBlock * kBlock;
    if (step < kBlock) step = kBlock;
    for (int64_t a = k0; a < k1; a += step) {
      int64_t b = a + step < k1 ? a + step : k1;
      accumulate<W, 4>(x, w, y, K, N, a, b);
      accumulate<W, M - 4>(x + 4 * K, w, y + 4 * N, K, N, a, b);
    }
  }
}

// y[:, n0:n1] = x . e[n0:n1, :]^T: one row of e at a time (one accumulator per row of x: more rows of e at
// once ran slower here), its K / 16 vectors summed in order, then the fixed tree, then the K % 16 tail.
template <typename W, int M>
void rows_of(const float* x, const W* e, float* y, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  const int64_t K16 = K / 16 * 16;
  for (int64_t n = n0; n < n1; ++n) {
    const W* row = e + n * K;
    v16 acc[M] = {};
    for (int64_t k = 0; k < K16; k += 16) {
      const v16 ev = load(row + k);
      for (int m = 0; m < M; ++m) acc[m] += load(x + m * K + k) * ev;
    }
    for (int m = 0; m < M; ++m) {
      float s = sum(acc[m]);
      for (int64_t k = K16; k < K; ++k) s += x[m * K + k] * value(row[k]);
      y[m * N + n] = s;
    }
  }
}

template <typename W>
using ChunkFn = void (*)(const float*, const W*, float*, int64_t, int64_t, int64_t, int64_t);

template <bool kRows, typename W>
ChunkFn<W> chunk_fn(int64_t rows) {
  static constexpr ChunkFn<W> by_k[kMaxRows] = {chunk<W, 1>, chunk<W, 2>, chunk<W, 3>, chunk<W, 4>,
                                                chunk<W, 5>, chunk<W, 6>, chunk<W, 7>, chunk<W, 8>};
  static constexpr ChunkFn<W> by_n[kMaxRows] = {rows_of<W, 1>, rows_of<W, 2>, rows_of<W, 3>, rows_of<W, 4>,
                                                rows_of<W, 5>, rows_of<W, 6>, rows_of<W, 7>, rows_of<W, 8>};
  return rows >= 1 && rows <= kMaxRows ? (kRows ? by_n : by_k)[rows - 1] : nullptr;
}

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Chunks are claimed from a counter by the calling thread and the pool's tasks alike, so the call finishes
// even when every other pool thread is busy; a task that starts late finds nothing left and returns.
template <typename W>
struct Work {
  ChunkFn<W> fn;
  bool by_rows;  // e [N, K]: chunks of N, each writing its columns of y; else chunks of K with partial sums
  const float* x;
  const W* w;
  float* y;
  int64_t rows, K, N, size, chunks;
  std::vector<float> partials;  // chunks of K 1.. (chunk 0 writes y)
  std::atomic<int64_t> next{0}, done{0};

  void run() {
    const int64_t total = by_rows ? N : K;
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      const int64_t a = c * size, b = a + size < total ? a + size : total;
      fn(x, w, by_rows || c == 0 ? y : partials.data() + (c - 1) * rows * N, K, N, a, b);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// T: the operands' dtype (F32, or BF16: x widened to float once, w as it is read); y is float32 either way.
template <bool kRows, ffi::DataType T>
ffi::Error Products(ffi::ThreadPool pool, ffi::Buffer<T> x, ffi::Buffer<T> w, ffi::ResultBuffer<ffi::F32> y) {
  using W = ffi::NativeType<T>;
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 2 || yd.size() != 2)
    return ffi::Error::InvalidArgument("cpu_products: x, w and y must be 2-D");
  const int64_t rows = xd[0], K = xd[1], N = kRows ? wd[0] : wd[1];
  if ((kRows ? wd[1] : wd[0]) != K || yd[0] != rows || yd[1] != N)
    return ffi::Error::InvalidArgument("cpu_products: shapes do not match x[M, K] . w = y[M, N]");
  const ChunkFn<W> fn = chunk_fn<kRows, W>(rows);
  if (fn == nullptr) return ffi::Error::InvalidArgument("cpu_products: 1 to 8 rows");
  if (K == 0 || N == 0) {
    std::memset(y->typed_data(), 0, sizeof(float) * rows * N);
    return ffi::Error::Success();
  }
  // the split depends on K, N and the pool's size only (never on `rows`): every row's sums run in one order
  int64_t threads = pool.num_threads();
  if (threads < 1) threads = 1;
  auto work = std::make_shared<Work<W>>();
  work->fn = fn;
  work->by_rows = kRows;
  std::vector<float> wide;
  if constexpr (std::is_same_v<W, float>) {
    work->x = x.typed_data();
  } else {
    wide.resize(rows * K);
    for (int64_t i = 0; i < rows * K; ++i) wide[i] = value(x.typed_data()[i]);
    work->x = wide.data();
  }
  work->w = w.typed_data();
  work->y = y->typed_data();
  work->rows = rows;
  work->K = K;
  work->N = N;
  const int64_t total = kRows ? N : K, per = (total + threads - 1) / threads;
  work->size = kRows ? per : (per + kBlock - 1) / kBlock * kBlock;
  work->chunks = (total + work->size - 1) / work->size;
  if (!kRows) work->partials.resize((work->chunks - 1) * rows * N);
  for (int64_t t = 1; t < work->chunks; ++t) pool.Schedule([work] { work->run(); });
  work->run();
  while (work->done.load(std::memory_order_acquire) < work->chunks) relax();
  float* out = work->y;
  for (int64_t c = 1; !kRows && c < work->chunks; ++c) {
    const float* p = work->partials.data() + (c - 1) * rows * N;
    for (int64_t i = 0; i < rows * N; ++i) out[i] += p[i];
  }
  return ffi::Error::Success();
}

}  // namespace

#define CARRYOVER_BIND(T)            \
  ffi::Ffi::Bind()                   \
      .Ctx<ffi::ThreadPool>()        \
      .Arg<ffi::Buffer<ffi::T>>()    \
      .Arg<ffi::Buffer<ffi::T>>()    \
      .Ret<ffi::Buffer<ffi::F32>>()
// w [K, N] (a Dense kernel) and e [N, K] (a tied embedding), float32 or bf16
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuProducts, (Products<false, ffi::F32>), CARRYOVER_BIND(F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuProductsRows, (Products<true, ffi::F32>), CARRYOVER_BIND(F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuProductsBf16, (Products<false, ffi::BF16>), CARRYOVER_BIND(BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuProductsRowsBf16, (Products<true, ffi::BF16>), CARRYOVER_BIND(BF16));

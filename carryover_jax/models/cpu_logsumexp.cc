// log Σ exp(x) along the last axis of a float32 array on the CPU: x [..., V] -> [...], each row by itself.
//
// Why: XLA CPU runs `jax.nn.logsumexp` over a [1024, 49152] block of SmolLM2's head logits (prepare's stored
// teacher log-sum-exp) as a library fusion whose exp-and-sum takes ~120 ms, nearly the 140 ms of the head's
// product itself. A row here is read twice: once for its max (from memory), then again from L2 for the
// sum of exp(x - max), 16 lanes at a time.
//
// A row's result depends on its own values and V only (its max, then its sum in one fixed order: four lane
// accumulators by vector index mod 4, then one tree), never on the other rows or the row count.
// NaN anywhere in a row gives NaN; a row whose max is +inf or -inf (all -inf, or V = 0) gives that max.
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace carryover;

constexpr float kInf = std::numeric_limits<float>::infinity();

float row_logsumexp(const float* x, int64_t n) {
  const int64_t full = n / 16 * 16;
  float tail[16];
  for (int i = 0; i < 16; ++i) tail[i] = full + i < n ? x[full + i] : -kInf;  // -inf: exp gives 0, max ignores
  v16 mx[4] = {v16{} - kInf, v16{} - kInf, v16{} - kInf, v16{} - kInf};
  v16 nan{};  // ones in the lanes that saw a NaN (x != x)
  auto see = [&](int j, v16 a) {
    mx[j] = a > mx[j] ? a : mx[j];
    nan += a != a ? v16{} + 1.0f : v16{};
  };
  int64_t i = 0;
  for (; i + 64 <= full; i += 64)
    for (int j = 0; j < 4; ++j) see(j, load(x + i + 16 * j));
  for (; i < full; i += 16) see(0, load(x + i));
  if (full < n) see(0, load(tail));
  const v16 m01 = mx[0] > mx[1] ? mx[0] : mx[1], m23 = mx[2] > mx[3] ? mx[2] : mx[3];
  const v16 mv = m01 > m23 ? m01 : m23;
  float m = mv[0];
  for (int j = 1; j < 16; ++j) m = mv[j] > m ? mv[j] : m;
  if (sum(nan) != 0.0f) return std::numeric_limits<float>::quiet_NaN();
  if (std::isinf(m)) return m;
  v16 acc[4] = {};
  i = 0;
  for (; i + 64 <= full; i += 64)
    for (int j = 0; j < 4; ++j) acc[j] += exp_nonpositive(load(x + i + 16 * j) - m);
  for (; i < full; i += 16) acc[0] += exp_nonpositive(load(x + i) - m);
  if (full < n) acc[0] += exp_nonpositive(load(tail) - m);
  return m + std::log(sum((acc[0] + acc[1]) + (acc[2] + acc[3])));
}

ffi::Error LogSumExp(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> out) {
  const auto dims = x.dimensions();
  if (dims.size() < 1) return ffi::Error::InvalidArgument("cpu_logsumexp: x must have at least one axis");
  const int64_t n = dims[dims.size() - 1];
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
  const float* xs = x.typed_data();
  float* os = out->typed_data();
  const int64_t threads = pool.num_threads() < 1 ? 1 : pool.num_threads();
  parallel_for(pool, rows, threads, [=](int64_t r) { os[r] = row_logsumexp(xs + r * n, n); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CarryoverCpuLogSumExp, LogSumExp,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().Ret<
                                  ffi::Buffer<ffi::F32>>());

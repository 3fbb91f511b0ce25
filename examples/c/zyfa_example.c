/* zyfa_example.c: launch one prebuilt zyfa attention-forward kernel from plain C.
 *
 *   zyfa_example CODE_OBJECT [batch seqlen_q seqlen_k hq hkv]
 *
 * Loads CODE_OBJECT (a .cubin for sm_90a, or a .hsaco for gfx950 when built with
 * -DZYFA_HIP), fills the kernel's argument struct from zyfa_kernels.h for a bf16
 * problem (default B=1, Sq=Sk=256, Hq=4, Hkv=2), launches it through the vendor driver
 * API with the packed `extra` argument buffer, and compares O and the log-sum-exp with
 * a double-precision CPU reference.  Exit status: 0 if the relative error of O is at
 * most 8e-3, the LSE error at most 1e-3 and nothing is NaN; 1 if not; 2 on any error.
 *
 * The kernel is chosen at compile time (the code object must contain its symbol):
 *   -DZYFA_EXAMPLE_KERNEL=fwd_sm_90a_bf16_d64x64_causal
 *   -DZYFA_EXAMPLE_KERNEL_UP=FWD_SM_90A_BF16_D64X64_CAUSAL
 * Default: the d128 non-causal bf16 kernel of the target (sm_90a, or gfx950 with ZYFA_HIP).
 *
 * -DZYFA_STUB_DRIVER (with ZYFA_HIP) replaces the HIP runtime by stubs that fail: the
 * program then compiles and links without ROCm, computes its reference and stops at hipInit.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zyfa_kernels.h"

/* ---- which kernel ------------------------------------------------------------------- */

#ifndef ZYFA_EXAMPLE_KERNEL
#ifdef ZYFA_HIP
#define ZYFA_EXAMPLE_KERNEL fwd_gfx950_bf16_d128x128_full
#define ZYFA_EXAMPLE_KERNEL_UP FWD_GFX950_BF16_D128X128_FULL
#else
#define ZYFA_EXAMPLE_KERNEL fwd_sm_90a_bf16_d128x128_full
#define ZYFA_EXAMPLE_KERNEL_UP FWD_SM_90A_BF16_D128X128_FULL
#endif
#endif

#define CAT3_(a, b, c) a##b##c
#define CAT3(a, b, c) CAT3_(a, b, c)
#define STR_(a) #a
#define STR(a) STR_(a)
#define KMACRO(what) CAT3(ZYFA_, ZYFA_EXAMPLE_KERNEL_UP, _##what)

typedef CAT3(zyfa_, ZYFA_EXAMPLE_KERNEL, _args) kernel_args;
#define kernel_grid CAT3(zyfa_, ZYFA_EXAMPLE_KERNEL, _grid)

#define K_SYMBOL KMACRO(SYMBOL)
#define K_DTYPE KMACRO(DTYPE)
#define K_D_QK KMACRO(D_QK)
#define K_D_V KMACRO(D_V)
#define K_CAUSAL KMACRO(CAUSAL)
#define K_BLOCK_SIZE KMACRO(BLOCK_SIZE)
#define K_DYNAMIC_SMEM KMACRO(DYNAMIC_SMEM)
#define K_TENSOR_MAPS KMACRO(TENSOR_MAPS)
#define K_PERSISTENT KMACRO(PERSISTENT)
#define K_WINDOW KMACRO(WINDOW)
#define kernel_tiles CAT3(zyfa_, ZYFA_EXAMPLE_KERNEL, _tiles)

/* ---- the driver API, CUDA or HIP ---------------------------------------------------- */

#ifdef ZYFA_HIP

#ifdef ZYFA_STUB_DRIVER
/* Just enough of hip_runtime_api.h to compile; every call fails. */
typedef int hipError_t;
typedef struct ihipModule_t *hipModule_t;
typedef struct ihipModuleSymbol_t *hipFunction_t;
typedef struct ihipStream_t *hipStream_t;
typedef void *hipDeviceptr_t;
#define hipSuccess 0
#define hipErrorNotSupported 801
#define hipFuncAttributeMaxDynamicSharedMemorySize 8
#define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define HIP_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define HIP_LAUNCH_PARAM_END ((void *)0x03)
static inline const char *hipGetErrorString(hipError_t e) {
  return e == hipErrorNotSupported ? "stub driver: built with -DZYFA_STUB_DRIVER" : "stub driver";
}
static inline hipError_t hipInit(unsigned int flags) { (void)flags; return hipErrorNotSupported; }
static inline hipError_t hipSetDevice(int dev) { (void)dev; return hipErrorNotSupported; }
static inline hipError_t hipModuleLoadData(hipModule_t *m, const void *image) {
  (void)m; (void)image; return hipErrorNotSupported;
}
static inline hipError_t hipModuleGetFunction(hipFunction_t *f, hipModule_t m, const char *name) {
  (void)f; (void)m; (void)name; return hipErrorNotSupported;
}
static inline hipError_t hipFuncSetAttribute(const void *f, int attr, int value) {
  (void)f; (void)attr; (void)value; return hipErrorNotSupported;
}
static inline hipError_t hipMalloc(void **p, size_t n) { (void)p; (void)n; return hipErrorNotSupported; }
static inline hipError_t hipFree(void *p) { (void)p; return hipErrorNotSupported; }
static inline hipError_t hipMemcpyHtoD(hipDeviceptr_t dst, void *src, size_t n) {
  (void)dst; (void)src; (void)n; return hipErrorNotSupported;
}
static inline hipError_t hipMemcpyDtoH(void *dst, hipDeviceptr_t src, size_t n) {
  (void)dst; (void)src; (void)n; return hipErrorNotSupported;
}
static inline hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gx, unsigned int gy,
                                               unsigned int gz, unsigned int bx, unsigned int by,
                                               unsigned int bz, unsigned int shared, hipStream_t s,
                                               void **params, void **extra) {
  (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)s;
  (void)params; (void)extra;
  return hipErrorNotSupported;
}
static inline hipError_t hipDeviceSynchronize(void) { return hipErrorNotSupported; }
static inline hipError_t hipModuleUnload(hipModule_t m) { (void)m; return hipErrorNotSupported; }
#else
#include <hip/hip_runtime_api.h>
#endif

typedef hipError_t drv_status;
typedef hipModule_t drv_module;
typedef hipFunction_t drv_function;
typedef void *drv_ptr;
#define DRV_OK hipSuccess
#define DRV_ERROR_STRING(r) hipGetErrorString(r)
#define DRV_PARAM_BUFFER_POINTER HIP_LAUNCH_PARAM_BUFFER_POINTER
#define DRV_PARAM_BUFFER_SIZE HIP_LAUNCH_PARAM_BUFFER_SIZE
#define DRV_PARAM_END HIP_LAUNCH_PARAM_END
#define DRV_ADDR(p) ((uint64_t)(uintptr_t)(p))

#else /* CUDA */

#include <cuda.h>

typedef CUresult drv_status;
typedef CUmodule drv_module;
typedef CUfunction drv_function;
typedef CUdeviceptr drv_ptr;
#define DRV_OK CUDA_SUCCESS
#define DRV_PARAM_BUFFER_POINTER CU_LAUNCH_PARAM_BUFFER_POINTER
#define DRV_PARAM_BUFFER_SIZE CU_LAUNCH_PARAM_BUFFER_SIZE
#define DRV_PARAM_END CU_LAUNCH_PARAM_END
#define DRV_ADDR(p) ((uint64_t)(p))
static const char *cuda_error_string(CUresult r) {
  const char *s = NULL;
  if (cuGetErrorString(r, &s) != CUDA_SUCCESS || s == NULL) s = "unknown CUDA error";
  return s;
}
#define DRV_ERROR_STRING(r) cuda_error_string(r)

/* A TMA tensor map of a dense (batch, rows, heads, d) tensor, as zyfa_kernels.h describes the
 * kernel's: its bytes, dims {row_bytes, heads, rows, batch}, strides in bytes (from strides in
 * elements), encoded into a 64-byte aligned CUtensorMap and copied into the struct's field. */
static CUresult encode_tensor_map(uint64_t *field, CUdeviceptr base, unsigned row_bytes, unsigned elem_bytes,
                                  int64_t stride_h, int64_t stride_s, int64_t stride_b, int heads, int rows,
                                  int batch, const cuuint32_t box[4], int swizzle_bytes) {
  CUtensorMap map;
  const cuuint64_t dims[4] = {row_bytes, (cuuint64_t)heads, (cuuint64_t)rows, (cuuint64_t)batch};
  const cuuint64_t strides[3] = {(cuuint64_t)(stride_h * elem_bytes), (cuuint64_t)(stride_s * elem_bytes),
                                 (cuuint64_t)(stride_b * elem_bytes)};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapSwizzle swizzle = swizzle_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                     : swizzle_bytes == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                                           : CU_TENSOR_MAP_SWIZZLE_NONE;
  CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, (void *)(uintptr_t)base, dims,
                                      strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) memcpy(field, &map, sizeof map);
  return r;
}

#endif

#define CHECK(call)                                                                         \
  do {                                                                                      \
    drv_status r_ = (call);                                                                 \
    if (r_ != DRV_OK) {                                                                     \
      fprintf(stderr, "zyfa_example: %s failed: %s (%d)\n", #call, DRV_ERROR_STRING(r_),     \
              (int)r_);                                                                     \
      return 2;                                                                             \
    }                                                                                       \
  } while (0)

/* ---- host helpers --------------------------------------------------------------------- */

static uint16_t float_to_bf16(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static double uniform01(void) { /* xorshift64*, 53-bit mantissa in (0, 1) */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return ((double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double normal(void) { /* Box-Muller */
  const double two_pi = 6.283185307179586;
  return sqrt(-2.0 * log(uniform01())) * cos(two_pi * uniform01());
}

static void fill_bf16(uint16_t *dst, size_t n) {
  size_t i;
  for (i = 0; i < n; ++i) dst[i] = float_to_bf16((float)normal());
}

static void *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  long n;
  void *buf;
  if (f == NULL) return NULL;
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) <= 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return NULL;
  }
  buf = malloc((size_t)n);
  if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *size = (size_t)n;
  return buf;
}

/* O = softmax(scale * Q K^T) V per (batch, head), in double precision, from the bf16 inputs.
 * Causal masking is bottom-right aligned: row i sees key j iff j <= i + (sk - sq).
 * lse is (B, Hq, Sq), natural log; a row that sees no key has O = 0 and lse = -inf. */
static void reference(const uint16_t *q, const uint16_t *k, const uint16_t *v, double *o, double *lse,
                      int batch, int sq, int sk, int hq, int hkv, double scale) {
  const int dqk = K_D_QK, dv = K_D_V, causal = K_CAUSAL;
  double *s = (double *)malloc(sizeof(double) * (size_t)sk);
  int b, h, i, j, d;
  for (b = 0; b < batch; ++b)
    for (h = 0; h < hq; ++h) {
      const int hk = h / (hq / hkv);
      for (i = 0; i < sq; ++i) {
        const uint16_t *qi = q + (((size_t)b * sq + i) * hq + h) * dqk;
        double *oi = o + (((size_t)b * sq + i) * hq + h) * dv;
        double mx = -INFINITY, sum = 0.0;
        int n_vis = sk;
        if (causal) n_vis = i + (sk - sq) + 1 < sk ? i + (sk - sq) + 1 : sk;
        if (n_vis < 0) n_vis = 0;
        for (j = 0; j < n_vis; ++j) {
          const uint16_t *kj = k + (((size_t)b * sk + j) * hkv + hk) * dqk;
          double acc = 0.0;
          for (d = 0; d < dqk; ++d) acc += (double)bf16_to_float(qi[d]) * bf16_to_float(kj[d]);
          s[j] = acc * scale;
          if (s[j] > mx) mx = s[j];
        }
        for (d = 0; d < dv; ++d) oi[d] = 0.0;
        for (j = 0; j < n_vis; ++j) {
          const uint16_t *vj = v + (((size_t)b * sk + j) * hkv + hk) * dv;
          const double p = exp(s[j] - mx);
          sum += p;
          for (d = 0; d < dv; ++d) oi[d] += p * bf16_to_float(vj[d]);
        }
        for (d = 0; d < dv && sum > 0.0; ++d) oi[d] /= sum;
        lse[((size_t)b * hq + h) * sq + i] = sum > 0.0 ? mx + log(sum) : -INFINITY;
      }
    }
  free(s);
}

/* ---- main ------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
  int batch = 1, sq = 256, sk = 256, hq = 4, hkv = 2;
  const int dqk = K_D_QK, dv = K_D_V;
  size_t n_q, n_k, n_v, n_o, n_lse, i, image_size = 0;
  uint16_t *hq_buf, *hk_buf, *hv_buf, *ho_buf;
  float *hlse;
  double *ref_o, *ref_lse;
  double err2 = 0.0, ref2 = 0.0, max_abs = 0.0, lse_err = 0.0, rel;
  int nan_count = 0, ok;
  void *image;
  kernel_args a;
  unsigned int gx, gy, gz;
  size_t arg_size = sizeof(kernel_args);
  void *extra[5];
  drv_module module;
  drv_function function;
  drv_ptr dq, dk, dvv, dout, dlse;
#if K_PERSISTENT
  drv_ptr dcounter;
#endif

  if (argc != 2 && argc != 7) {
    fprintf(stderr, "usage: %s CODE_OBJECT [batch seqlen_q seqlen_k hq hkv]\n"
                    "  CODE_OBJECT: prebuilt/%s\n", argv[0], KMACRO(FILE));
    return 2;
  }
  if (argc == 7) {
    batch = atoi(argv[2]); sq = atoi(argv[3]); sk = atoi(argv[4]); hq = atoi(argv[5]); hkv = atoi(argv[6]);
  }
  if (batch < 1 || sq < 1 || sk < 1 || hq < 1 || hkv < 1 || hq % hkv != 0) {
    fprintf(stderr, "zyfa_example: need positive sizes and hq a multiple of hkv\n");
    return 2;
  }
  if (strcmp(K_DTYPE, "bf16") != 0) {
    fprintf(stderr, "zyfa_example: %s takes %s inputs; this example feeds bf16\n", K_SYMBOL, K_DTYPE);
    return 2;
  }
  printf("kernel %s  B=%d Sq=%d Sk=%d Hq=%d Hkv=%d Dqk=%d Dv=%d causal=%d\n", K_SYMBOL, batch, sq, sk,
         hq, hkv, dqk, dv, K_CAUSAL);

  /* host data and the reference */
  n_q = (size_t)batch * sq * hq * dqk;
  n_k = (size_t)batch * sk * hkv * dqk;
  n_v = (size_t)batch * sk * hkv * dv;
  n_o = (size_t)batch * sq * hq * dv;
  n_lse = (size_t)batch * hq * sq;
  hq_buf = (uint16_t *)malloc(2 * n_q);
  hk_buf = (uint16_t *)malloc(2 * n_k);
  hv_buf = (uint16_t *)malloc(2 * n_v);
  ho_buf = (uint16_t *)malloc(2 * n_o);
  hlse = (float *)malloc(4 * n_lse);
  ref_o = (double *)malloc(sizeof(double) * n_o);
  ref_lse = (double *)malloc(sizeof(double) * n_lse);
  if (!hq_buf || !hk_buf || !hv_buf || !ho_buf || !hlse || !ref_o || !ref_lse) {
    fprintf(stderr, "zyfa_example: out of host memory\n");
    return 2;
  }
  fill_bf16(hq_buf, n_q);
  fill_bf16(hk_buf, n_k);
  fill_bf16(hv_buf, n_v);
  for (i = 0; i < n_o; ++i) ho_buf[i] = 0x7fc0; /* poison: bf16 NaN */
  for (i = 0; i < n_lse; ++i) hlse[i] = NAN;
  reference(hq_buf, hk_buf, hv_buf, ref_o, ref_lse, batch, sq, sk, hq, hkv, 1.0 / sqrt((double)dqk));

  image = read_file(argv[1], &image_size);
  if (image == NULL) {
    fprintf(stderr, "zyfa_example: cannot read %s\n", argv[1]);
    return 2;
  }

  /* device, module, function */
#ifdef ZYFA_HIP
  CHECK(hipInit(0));
  CHECK(hipSetDevice(0));
  CHECK(hipModuleLoadData(&module, image));
  CHECK(hipModuleGetFunction(&function, module, K_SYMBOL));
  if (K_DYNAMIC_SMEM > 0) /* the gfx950 kernels keep their LDS static */
    CHECK(hipFuncSetAttribute((const void *)function, hipFuncAttributeMaxDynamicSharedMemorySize,
                              K_DYNAMIC_SMEM));
  CHECK(hipMalloc(&dq, 2 * n_q));
  CHECK(hipMalloc(&dk, 2 * n_k));
  CHECK(hipMalloc(&dvv, 2 * n_v));
  CHECK(hipMalloc(&dout, 2 * n_o));
  CHECK(hipMalloc(&dlse, 4 * n_lse));
  CHECK(hipMemcpyHtoD(dq, hq_buf, 2 * n_q));
  CHECK(hipMemcpyHtoD(dk, hk_buf, 2 * n_k));
  CHECK(hipMemcpyHtoD(dvv, hv_buf, 2 * n_v));
  CHECK(hipMemcpyHtoD(dout, ho_buf, 2 * n_o));
  CHECK(hipMemcpyHtoD(dlse, hlse, 4 * n_lse));
#else
  {
    CUdevice dev;
    CUcontext ctx;
    char name[128];
    int major = 0, minor = 0;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceGetName(name, (int)sizeof name, dev));
    CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    printf("device 0: %s (sm_%d%d)\n", name, major, minor);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
  }
  CHECK(cuModuleLoadData(&module, image));
  CHECK(cuModuleGetFunction(&function, module, K_SYMBOL));
  if (K_DYNAMIC_SMEM > 48 * 1024) /* above the default limit the kernel must opt in */
    CHECK(cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, K_DYNAMIC_SMEM));
  CHECK(cuMemAlloc(&dq, 2 * n_q));
  CHECK(cuMemAlloc(&dk, 2 * n_k));
  CHECK(cuMemAlloc(&dvv, 2 * n_v));
  CHECK(cuMemAlloc(&dout, 2 * n_o));
  CHECK(cuMemAlloc(&dlse, 4 * n_lse));
  CHECK(cuMemcpyHtoD(dq, hq_buf, 2 * n_q));
  CHECK(cuMemcpyHtoD(dk, hk_buf, 2 * n_k));
  CHECK(cuMemcpyHtoD(dvv, hv_buf, 2 * n_v));
  CHECK(cuMemcpyHtoD(dout, ho_buf, 2 * n_o));
  CHECK(cuMemcpyHtoD(dlse, hlse, 4 * n_lse));
#endif

  /* the argument struct: (B, S, H, D) tensors, strides in elements; lse (B, Hq, Sq) */
  memset(&a, 0, sizeof a);
  a.q = DRV_ADDR(dq);
  a.k = DRV_ADDR(dk);
  a.v = DRV_ADDR(dvv);
  a.o = DRV_ADDR(dout);
  a.lse = DRV_ADDR(dlse);
  a.cu_seqlens_q = 0; /* fixed-length batch */
  a.cu_seqlens_k = 0;
  a.q_stride_b = (int64_t)sq * hq * dqk; a.q_stride_s = (int64_t)hq * dqk; a.q_stride_h = dqk;
  a.k_stride_b = (int64_t)sk * hkv * dqk; a.k_stride_s = (int64_t)hkv * dqk; a.k_stride_h = dqk;
  a.v_stride_b = (int64_t)sk * hkv * dv; a.v_stride_s = (int64_t)hkv * dv; a.v_stride_h = dv;
  a.o_stride_b = (int64_t)sq * hq * dv; a.o_stride_s = (int64_t)hq * dv; a.o_stride_h = dv;
  a.lse_stride_b = (int64_t)hq * sq; a.lse_stride_h = sq;
  a.batch = batch;
  a.hq = hq;
  a.hkv = hkv;
  a.seqlen_q = sq;
  a.seqlen_k = sk;
  a.softmax_scale = (float)(1.0 / sqrt((double)dqk));
#if K_WINDOW
  /* a kernel that takes a sliding window: -1 and -1 is none (zeros would be a window of one key) */
  a.window_left = -1;
  a.window_right = -1;
#endif
#ifndef ZYFA_HIP
  /* the sm_90a kernels read Q, K (and BF16's V) by TMA, and the persistent BF16 ones write O
     so: a tensor map of each (the header's X-macro), over the heads and rows of its tensor */
#define MAP_HEADS_q hq
#define MAP_HEADS_k hkv
#define MAP_HEADS_v hkv
#define MAP_HEADS_o hq
#define MAP_ROWS_q sq
#define MAP_ROWS_k sk
#define MAP_ROWS_v sk
#define MAP_ROWS_o sq
#define ENCODE_MAP(arg, t, row_bytes, elem_bytes, b0, b1, b2, b3, swizzle)                            \
  {                                                                                                 \
    const cuuint32_t box[4] = {b0, b1, b2, b3};                                                     \
    CHECK(encode_tensor_map(a.arg, (CUdeviceptr)a.t, row_bytes, elem_bytes, a.t##_stride_h,           \
                            a.t##_stride_s, a.t##_stride_b, MAP_HEADS_##t, MAP_ROWS_##t, batch, box, \
                            swizzle));                                                              \
  }
  K_TENSOR_MAPS(ENCODE_MAP)
#undef ENCODE_MAP
#endif
#if K_PERSISTENT
  /* a persistent kernel: one CTA an SM, taking tiles from a counter (zeroed once; every launch
     leaves it zero) */
  {
    CUdevice dev;
    int sms = 0;
    if (kernel_tiles(&a) != 0) {
      fprintf(stderr, "too many tiles for one launch: split the batch or the sequence\n");
      return 2;
    }
    CHECK(cuMemAlloc(&dcounter, KMACRO(COUNTER_BYTES)));
    CHECK(cuMemsetD8(dcounter, 0, KMACRO(COUNTER_BYTES)));
    a.tile_counter = DRV_ADDR(dcounter);
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    kernel_grid(&a, (unsigned)sms, &gx, &gy, &gz);
  }
#else
  kernel_grid(&a, &gx, &gy, &gz);
#endif

  extra[0] = DRV_PARAM_BUFFER_POINTER;
  extra[1] = &a;
  extra[2] = DRV_PARAM_BUFFER_SIZE;
  extra[3] = &arg_size;
  extra[4] = DRV_PARAM_END;
  printf("launch grid (%u, %u, %u) x %d threads, %d dynamic shared bytes, %zu argument bytes\n", gx, gy,
         gz, K_BLOCK_SIZE, K_DYNAMIC_SMEM, arg_size);

#ifdef ZYFA_HIP
  CHECK(hipModuleLaunchKernel(function, gx, gy, gz, K_BLOCK_SIZE, 1, 1, K_DYNAMIC_SMEM, NULL, NULL, extra));
  CHECK(hipDeviceSynchronize());
  CHECK(hipMemcpyDtoH(ho_buf, dout, 2 * n_o));
  CHECK(hipMemcpyDtoH(hlse, dlse, 4 * n_lse));
  CHECK(hipFree(dq)); CHECK(hipFree(dk)); CHECK(hipFree(dvv)); CHECK(hipFree(dout)); CHECK(hipFree(dlse));
  CHECK(hipModuleUnload(module));
#else
  CHECK(cuLaunchKernel(function, gx, gy, gz, K_BLOCK_SIZE, 1, 1, K_DYNAMIC_SMEM, NULL, NULL, extra));
  CHECK(cuCtxSynchronize());
  CHECK(cuMemcpyDtoH(ho_buf, dout, 2 * n_o));
  CHECK(cuMemcpyDtoH(hlse, dlse, 4 * n_lse));
  CHECK(cuMemFree(dq)); CHECK(cuMemFree(dk)); CHECK(cuMemFree(dvv)); CHECK(cuMemFree(dout)); CHECK(cuMemFree(dlse));
#if K_PERSISTENT
  CHECK(cuMemFree(dcounter));
#endif
  CHECK(cuModuleUnload(module));
  {
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRelease(dev));
  }
#endif

  /* compare */
  for (i = 0; i < n_o; ++i) {
    const double got = bf16_to_float(ho_buf[i]), d = got - ref_o[i];
    if (isnan(got)) { ++nan_count; continue; }
    err2 += d * d;
    ref2 += ref_o[i] * ref_o[i];
    if (fabs(d) > max_abs) max_abs = fabs(d);
  }
  for (i = 0; i < n_lse; ++i) {
    double d;
    if (isnan(hlse[i])) { ++nan_count; continue; }
    d = isinf(ref_lse[i]) && (double)hlse[i] == ref_lse[i] ? 0.0 : fabs((double)hlse[i] - ref_lse[i]);
    if (d > lse_err) lse_err = d;
  }
  rel = ref2 > 0.0 ? sqrt(err2 / ref2) : sqrt(err2);
  ok = nan_count == 0 && rel <= 8e-3 && lse_err <= 1e-3;
  printf("O: relative error %.3e (max abs %.3e), LSE: max abs error %.3e, NaN: %d  -> %s\n", rel, max_abs,
         lse_err, nan_count, ok ? "PASS" : "FAIL");
  free(image); free(hq_buf); free(hk_buf); free(hv_buf); free(ho_buf); free(hlse); free(ref_o); free(ref_lse);
  return ok ? 0 : 1;
}

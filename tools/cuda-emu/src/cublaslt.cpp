// libcublasLt.so.13 of the emulated GPU: `D = alpha · op(A) · op(B) + beta · C`
// on column-major matrices, as cuBLASLt defines it: layouts of rows, columns and
// leading dimension, transposes, strided batches, f32 or bf16 operands with f32
// accumulation and an f32 or bf16 output, and C not read when beta is 0. What the
// real library rejects is rejected here too: operand types it has no kernel for,
// shapes that do not agree, leading dimensions shorter than a column, batch counts
// that differ, pointers less aligned than the algorithm was chosen for. A product
// runs when its stream is synchronized; one that would touch memory outside its
// buffers is an illegal address.

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_bf16.h"
#include "driver.h"
#include "pool.h"

typedef int cublasStatus_t;
enum : cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum { CUBLAS_COMPUTE_32F = 68 };
enum { CUDA_ERROR_ILLEGAL_ADDRESS = 700 };

namespace {

constexpr uint64_t kHandle = 0x6375626c61734c74ull;  // "cublasLt"
constexpr uint64_t kAlgo = 0x656d752d616c676full;    // "emu-algo"

struct Handle {
    uint64_t magic = kHandle;
};

struct Layout {
    int type;
    uint64_t rows, cols;
    int64_t ld;
    int order = 0;  // CUBLASLT_ORDER_COL
    int batch = 1;
    int64_t stride = 0;
};

struct Desc {
    int compute, scale;
    int trans[2] = {0, 0};
    int epilogue = 1;  // CUBLASLT_EPILOGUE_DEFAULT
    int pointer_mode = 0;  // host
};

struct Preference {
    uint64_t workspace = 0;
    uint32_t alignment[4] = {256, 256, 256, 256};  // A, B, C, D
};

struct Algo {
    uint64_t magic;
    uint64_t alignment[4];
    uint64_t unused[3];
};
static_assert(sizeof(Algo) == 64, "cublasLtMatmulAlgo_t is 8 uint64");

struct HeuristicResult {
    Algo algo;
    size_t workspace;
    cublasStatus_t state;
    float waves;
    int reserved[4];
};

size_t element_size(int type) { return type == CUDA_R_32F ? 4 : 2; }

const char* type_name(int type) {
    switch (type) {
        case CUDA_R_32F: return "f32";
        case CUDA_R_16BF: return "bf16";
        default: return "an unsupported type";
    }
}

template <typename T>
cublasStatus_t read_attribute(T* out, const void* buf, size_t size) {
    if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(out, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t reject(cublasStatus_t status, const std::string& why) {
    std::fprintf(stderr, "cuda-emu: cuBLASLt: %s\n", why.c_str());
    return status;
}

/// The product's shape `(m, k, n)`, or a rejection as the real library would.
cublasStatus_t check(const Desc& d, const Layout& a, const Layout& b, const Layout& c,
                     const Layout& dl) {
    if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F) {
        return reject(CUBLAS_STATUS_NOT_SUPPORTED, "only f32 compute and scale are emulated");
    }
    if (d.epilogue != 1 || d.pointer_mode != 0) {
        return reject(CUBLAS_STATUS_NOT_SUPPORTED, "only the default epilogue and host scalars are emulated");
    }
    if (a.type != b.type || (a.type != CUDA_R_32F && a.type != CUDA_R_16BF) ||
        (c.type != dl.type) || (c.type != a.type && c.type != CUDA_R_32F)) {
        return reject(CUBLAS_STATUS_NOT_SUPPORTED,
                      std::string("no kernel for A ") + type_name(a.type) + ", B " + type_name(b.type) +
                          ", C " + type_name(c.type) + ", D " + type_name(dl.type) + " with f32 compute");
    }
    for (const Layout* l : {&a, &b, &c, &dl}) {
        if (l->order != 0) return reject(CUBLAS_STATUS_NOT_SUPPORTED, "only column-major layouts are emulated");
        if (l->ld < int64_t(l->rows) || l->ld < 1) {
            return reject(CUBLAS_STATUS_INVALID_VALUE,
                          "leading dimension " + std::to_string(l->ld) + " is shorter than a column of " +
                              std::to_string(l->rows) + " rows");
        }
    }
    uint64_t m = dl.rows, n = dl.cols;
    uint64_t a_rows = d.trans[0] ? a.cols : a.rows, k = d.trans[0] ? a.rows : a.cols;
    uint64_t b_rows = d.trans[1] ? b.cols : b.rows, b_cols = d.trans[1] ? b.rows : b.cols;
    if (a_rows != m || b_rows != k || b_cols != n || c.rows != m || c.cols != n) {
        return reject(CUBLAS_STATUS_INVALID_VALUE,
                      "shapes disagree: op(A) " + std::to_string(a_rows) + "x" + std::to_string(k) +
                          ", op(B) " + std::to_string(b_rows) + "x" + std::to_string(b_cols) + ", C " +
                          std::to_string(c.rows) + "x" + std::to_string(c.cols) + ", D " +
                          std::to_string(m) + "x" + std::to_string(n));
    }
    if (a.batch != dl.batch || b.batch != dl.batch || c.batch != dl.batch) {
        return reject(CUBLAS_STATUS_INVALID_VALUE, "batch counts differ");
    }
    return CUBLAS_STATUS_SUCCESS;
}

uint64_t alignment_of(uint64_t ptr) {
    return ptr == 0 ? 256 : std::min<uint64_t>(256, ptr & (~ptr + 1));
}

__attribute__((no_sanitize_address)) inline float element_as_f32(const void* base, int type, int64_t i) {
    if (type == CUDA_R_32F) return static_cast<const float*>(base)[i];
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

__attribute__((no_sanitize_address)) inline void store(void* base, int type, int64_t i, float v) {
    if (type == CUDA_R_32F) {
        static_cast<float*>(base)[i] = v;
    } else {
        static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
    }
}

/// Bytes a layout touches from its pointer.
uint64_t extent(const Layout& l) {
    return ((l.batch - 1) * uint64_t(l.stride) + (l.cols - 1) * uint64_t(l.ld) + l.rows) *
           element_size(l.type);
}

struct Product {
    Desc d;
    Layout a, b, c, dl;
    float alpha, beta;
    const void *pa, *pb, *pc;
    void* pd;

    /// Every entry's op(A) by rows and op(B) by columns, each a contiguous run of k
    /// values, then the dot products, columns of all entries in parallel.
    void run() const {
        const uint64_t m = dl.rows, n = dl.cols, k = d.trans[0] ? a.rows : a.cols;
        const uint64_t batches = uint64_t(dl.batch);
        std::vector<float> ar(batches * m * k), bc(batches * n * k);
        cuemu::parallel_for(batches, [&](size_t e) {
            pack(&ar[e * m * k], &bc[e * n * k], e, m, n, k);
        });
        cuemu::parallel_for(batches * n, [&](size_t i) {
            size_t e = i / n, col = i % n;
            column(&ar[e * m * k], &bc[(e * n + col) * k], e, col, m, k);
        });
    }

    __attribute__((no_sanitize_address)) void pack(float* ar, float* bc, uint64_t e, uint64_t m,
                                                   uint64_t n, uint64_t k) const {
        const int64_t oa = int64_t(e) * a.stride, ob = int64_t(e) * b.stride;
        for (uint64_t r = 0; r < m; r++)
            for (uint64_t p = 0; p < k; p++)
                ar[r * k + p] = element_as_f32(pa, a.type, oa + int64_t(d.trans[0] ? p + r * a.ld : r + p * a.ld));
        for (uint64_t col = 0; col < n; col++)
            for (uint64_t p = 0; p < k; p++)
                bc[col * k + p] = element_as_f32(pb, b.type, ob + int64_t(d.trans[1] ? col + p * b.ld : p + col * b.ld));
    }

    /// Column `col` of entry `e`: `D(:, col) = alpha · op(A) · y + beta · C(:, col)`.
    __attribute__((no_sanitize_address)) void column(const float* ar, const float* y, uint64_t e,
                                                     uint64_t col, uint64_t m, uint64_t k) const {
        const int64_t oc = int64_t(e) * c.stride, od = int64_t(e) * dl.stride;
        for (uint64_t r = 0; r < m; r++) {
            const float* x = &ar[r * k];
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            uint64_t p = 0;
            for (; p + 8 <= k; p += 8)
                for (int j = 0; j < 8; j++) acc[j] += x[p + j] * y[p + j];
            for (; p < k; p++) acc[0] += x[p] * y[p];
            float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            float v = alpha * sum;
            if (beta != 0.0f) v += beta * element_as_f32(pc, c.type, oc + int64_t(r + col * c.ld));
            store(pd, dl.type, od + int64_t(r + col * dl.ld), v);
        }
    }
};

}  // namespace

#define API extern "C" __attribute__((visibility("default")))

API cublasStatus_t cublasLtCreate(Handle** handle) {
    if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new Handle();
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasLtDestroy(Handle* handle) {
    if (handle == nullptr || handle->magic != kHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = 0;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasLtMatrixLayoutCreate(Layout** layout, int type, uint64_t rows, uint64_t cols,
                                              int64_t ld) {
    if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *layout = new Layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasLtMatrixLayoutDestroy(Layout* layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasLtMatrixLayoutSetAttribute(Layout* l, int attribute, const void* buf,
                                                    size_t size) {
    if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attribute) {
        case 0: return read_attribute(&l->type, buf, size);
        case 1: return read_attribute(&l->order, buf, size);
        case 2: return read_attribute(&l->rows, buf, size);
        case 3: return read_attribute(&l->cols, buf, size);
        case 4: return read_attribute(&l->ld, buf, size);
        case 5: return read_attribute(&l->batch, buf, size);
        case 6: return read_attribute(&l->stride, buf, size);
        default: return reject(CUBLAS_STATUS_NOT_SUPPORTED, "layout attribute " + std::to_string(attribute) + " is not emulated");
    }
}

API cublasStatus_t cublasLtMatmulDescCreate(Desc** desc, int compute, int scale) {
    if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *desc = new Desc{compute, scale};
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasLtMatmulDescDestroy(Desc* desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasLtMatmulDescSetAttribute(Desc* d, int attribute, const void* buf, size_t size) {
    if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t s;
    switch (attribute) {
        case 0: return read_attribute(&d->compute, buf, size);
        case 1: return read_attribute(&d->scale, buf, size);
        case 2: return read_attribute(&d->pointer_mode, buf, size);
        case 3:
        case 4: {
            int op;
            if ((s = read_attribute(&op, buf, size))) return s;
            if (op < 0 || op > 2) return CUBLAS_STATUS_INVALID_VALUE;
            d->trans[attribute - 3] = op != 0;  // CUBLAS_OP_C is T for real types
            return CUBLAS_STATUS_SUCCESS;
        }
        case 7: return read_attribute(&d->epilogue, buf, size);
        default: return reject(CUBLAS_STATUS_NOT_SUPPORTED, "matmul attribute " + std::to_string(attribute) + " is not emulated");
    }
}

API cublasStatus_t cublasLtMatmulPreferenceCreate(Preference** pref) {
    if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = new Preference();
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasLtMatmulPreferenceDestroy(Preference* pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(Preference* p, int attribute, const void* buf,
                                                        size_t size) {
    if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attribute) {
        case 1: return read_attribute(&p->workspace, buf, size);
        case 5: case 6: case 7: case 8: {
            uint32_t v;
            if (cublasStatus_t s = read_attribute(&v, buf, size)) return s;
            if (v == 0 || (v & (v - 1)) != 0) return CUBLAS_STATUS_INVALID_VALUE;
            p->alignment[attribute - 5] = v;
            return CUBLAS_STATUS_SUCCESS;
        }
        default: return reject(CUBLAS_STATUS_NOT_SUPPORTED, "preference attribute " + std::to_string(attribute) + " is not emulated");
    }
}

API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(Handle* handle, Desc* d, Layout* a, Layout* b, Layout* c,
                                                  Layout* dl, Preference* pref, int requested,
                                                  HeuristicResult* results, int* count) {
    if (handle == nullptr || handle->magic != kHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!d || !a || !b || !c || !dl || !pref || requested < 1 || !results || !count) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (cublasStatus_t s = check(*d, *a, *b, *c, *dl)) return s;
    const Layout* layouts[4] = {a, b, c, dl};
    for (int i = 0; i < 4; i++) {
        // No algorithm reads an element at less than its own alignment.
        if (pref->alignment[i] < element_size(layouts[i]->type)) {
            *count = 0;
            return reject(CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm for a matrix aligned to " +
                                                           std::to_string(pref->alignment[i]) + " bytes");
        }
    }
    std::memset(results, 0, sizeof(HeuristicResult));
    results[0].algo.magic = kAlgo;
    for (int i = 0; i < 4; i++) results[0].algo.alignment[i] = pref->alignment[i];
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].waves = 1.0f;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasLtMatmul(Handle* handle, Desc* d, const void* alpha, const void* a, Layout* la,
                                  const void* b, Layout* lb, const void* beta, const void* c, Layout* lc,
                                  void* dp, Layout* ld, const Algo* algo, void* workspace,
                                  size_t workspace_bytes, void* stream) {
    (void)workspace;
    (void)workspace_bytes;
    if (handle == nullptr || handle->magic != kHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!d || !alpha || !beta || !la || !lb || !lc || !ld) return CUBLAS_STATUS_INVALID_VALUE;
    if (cublasStatus_t s = check(*d, *la, *lb, *lc, *ld)) return s;
    if (algo == nullptr || algo->magic != kAlgo) {
        return reject(CUBLAS_STATUS_INVALID_VALUE, "the algorithm is not one the heuristic returned");
    }
    const void* ptrs[4] = {a, b, c, dp};
    for (int i = 0; i < 4; i++) {
        uint64_t have = alignment_of(reinterpret_cast<uint64_t>(ptrs[i]));
        if (have < algo->alignment[i]) {
            return reject(CUBLAS_STATUS_INVALID_VALUE,
                          std::string("matrix ") + "ABCD"[i] + " is aligned to " + std::to_string(have) +
                              " bytes, the algorithm was chosen for " + std::to_string(algo->alignment[i]));
        }
    }
    Product p{*d, *la, *lb, *lc, *ld, 0, 0, a, b, c, dp};
    std::memcpy(&p.alpha, alpha, 4);
    std::memcpy(&p.beta, beta, 4);
    int queued = cuemu::enqueue(stream, [p] {
        const char* names = "ABCD";
        const Layout* layouts[4] = {&p.a, &p.b, &p.c, &p.dl};
        const void* ptrs[4] = {p.pa, p.pb, p.pc, p.pd};
        for (int i = 0; i < 4; i++) {
            if (i == 2 && p.beta == 0.0f) continue;  // C is not read
            std::string why;
            if (!cuemu::in_device_memory(reinterpret_cast<uint64_t>(ptrs[i]), extent(*layouts[i]), &why)) {
                cuemu::fault(CUDA_ERROR_ILLEGAL_ADDRESS,
                             std::string("cublasLtMatmul: matrix ") + names[i] + " (" +
                                 std::to_string(layouts[i]->rows) + "x" + std::to_string(layouts[i]->cols) +
                                 ", ld " + std::to_string(layouts[i]->ld) + ", batch " +
                                 std::to_string(layouts[i]->batch) + "): " + why);
                return;
            }
        }
        cuemu::count_product();
        p.run();
    });
    return queued == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

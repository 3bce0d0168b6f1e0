/* FGD's fragmentation row by row, compiled ahead of time: the C engine of
 * scheduler/core/fragkernel.py.
 *
 * Why C and not only numba: a replay or an extender in a fresh process pays ~0.45 s to import
 * numba and load its cached kernel (and ~120 MiB of compiler), more than half of a whole openb
 * replay; this module imports in well under a millisecond. It computes exactly what
 * fragkernel._frag_rows computes, in the same floating-point order (spec by spec into seven
 * categories, then the categories in order), so every engine gives the numpy form's bits
 * (tests/scheduler/core/test_fragkernel.py). Built with -ffp-contract=off: a fused
 * multiply-add would round differently. Every buffer is checked (type, shape, index ranges)
 * before the loop, so bad input raises ValueError instead of reading out of bounds, and the
 * loop runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Py_buffer view;
    int held;
} Held;

static void release_all(Held *held, int n) {
    for (int i = 0; i < n; i++) {
        if (held[i].held) {
            PyBuffer_Release(&held[i].view);
            held[i].held = 0;
        }
    }
}

/* Acquire a C-contiguous buffer of ndim dimensions whose items are `kind` ('i': 8-byte
 * signed integers, 'd': 8-byte floats, '?': 1-byte booleans). */
static int acquire(PyObject *obj, Held *slot, const char *name, int ndim, char kind,
                   int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &slot->view, flags) < 0) {
        PyErr_Format(PyExc_ValueError, "%s: not a C-contiguous%s array", name,
                     writable ? " writable" : "");
        return -1;
    }
    slot->held = 1;
    const char *fmt = slot->view.format ? slot->view.format : "B";
    if (fmt[0] == '=' || fmt[0] == '<' || fmt[0] == '@') fmt++;
    int ok;
    switch (kind) {
    case 'i': ok = slot->view.itemsize == 8 && strchr("lq", fmt[0]) && fmt[1] == 0; break;
    case 'd': ok = slot->view.itemsize == 8 && fmt[0] == 'd' && fmt[1] == 0; break;
    default: ok = slot->view.itemsize == 1 && fmt[0] == '?' && fmt[1] == 0; break;
    }
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s: items must be %s, got format '%s'", name,
                     kind == 'i' ? "int64" : kind == 'd' ? "float64" : "bool", fmt);
        return -1;
    }
    if (slot->view.ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions expected, got %d", name, ndim,
                     slot->view.ndim);
        return -1;
    }
    return 0;
}

static int same_length(Held *slot, const char *name, Py_ssize_t n, const char *of) {
    if (slot->view.shape[0] != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries, %s has %zd", name,
                     slot->view.shape[0], of, n);
        return -1;
    }
    return 0;
}

/* The workload's specs, as the kernel reads them. */
typedef struct {
    const int64_t *thresholds, *threshold_of, *cpu_milli, *num_gpu, *gpu_milli;
    const double *popularity;
    const unsigned char *allowed;
    Py_ssize_t levels, specs, products;
    int constrained;
} Specs;

/* F of one row: `row` holds its GPUs' free milli, `cpu` its free CPU, `product` its product
 * code; count and fitted are scratch of `levels` entries each. */
static double frag_one(const int64_t *row, Py_ssize_t width, int64_t cpu, int64_t product,
                       const Specs *w, int64_t *count, int64_t *fitted) {
    int64_t total = 0;
    for (Py_ssize_t g = 0; g < width; g++) total += row[g];
    for (Py_ssize_t d = 0; d < w->levels; d++) {
        int64_t c = 0, s = 0, t = w->thresholds[d];
        for (Py_ssize_t g = 0; g < width; g++) {
            if (row[g] >= t) {
                c += 1;
                s += row[g];
            }
        }
        count[d] = c;
        fitted[d] = s;
    }
    const double whole = (double)total;
    double lack_both = 0.0, lack_gpu = 0.0, lack_cpu = 0.0;
    double cpu_fits = 0.0, cpu_lacks = 0.0, no_access = 0.0;
    for (Py_ssize_t m = 0; m < w->specs; m++) {
        const double p = w->popularity[m];
        const int cpu_ok = cpu >= w->cpu_milli[m];
        if (w->gpu_milli[m] == 0) {
            if (cpu_ok) cpu_fits += p * whole;
            else cpu_lacks += p * whole;
            continue;
        }
        if (w->constrained && !w->allowed[m * w->products + product]) {
            no_access += p * whole;
            continue;
        }
        const Py_ssize_t d = (Py_ssize_t)w->threshold_of[m];
        const int host = count[d] >= w->num_gpu[m];
        if (cpu_ok) {
            if (host) lack_gpu += p * (double)(total - fitted[d]);
            else lack_gpu += p * whole;
        } else if (host) {
            lack_cpu += p * whole;
        } else {
            lack_both += p * whole;
        }
    }
    return lack_both + lack_gpu + lack_cpu + cpu_fits + cpu_lacks + no_access;
}

enum { FREE, CPU_LEFT, PRODUCT, THRESHOLDS, THRESHOLD_OF, CPU_MILLI, NUM_GPU, GPU_MILLI,
       POPULARITY, ALLOWED, OUT, NBUF };

static const char *names[NBUF] = {"free", "cpu_left", "product", "thresholds", "threshold_of",
                                  "cpu_milli", "num_gpu", "gpu_milli", "popularity", "allowed",
                                  "out"};
static const char kinds[NBUF] = {'i', 'i', 'i', 'i', 'i', 'i', 'i', 'i', 'd', '?', 'd'};

/* The rows a call reads and the output it writes. */
typedef struct {
    Py_ssize_t rows, width;
    const int64_t *free_, *cpu_left, *product;
    double *out;
} Rows;

/* Acquire and check every buffer (out has `out_dims` dimensions); fill the specs and rows.
 * On failure the caller releases what was held. */
static int acquire_all(PyObject **obj, Held *held, int out_dims, int constrained, Specs *w,
                       Rows *r) {
    const int dims[NBUF] = {2, 1, 1, 1, 1, 1, 1, 1, 1, 2, out_dims};
    memset(held, 0, sizeof(Held) * NBUF);
    for (int i = 0; i < NBUF; i++) {
        if (acquire(obj[i], &held[i], names[i], dims[i], kinds[i], i == OUT) < 0) return -1;
    }
    const Py_ssize_t rows = held[FREE].view.shape[0];
    const Py_ssize_t specs = held[CPU_MILLI].view.shape[0];
    if (same_length(&held[CPU_LEFT], "cpu_left", rows, "free") < 0
        || same_length(&held[PRODUCT], "product", rows, "free") < 0
        || same_length(&held[OUT], "out", rows, "free") < 0
        || same_length(&held[THRESHOLD_OF], "threshold_of", specs, "cpu_milli") < 0
        || same_length(&held[NUM_GPU], "num_gpu", specs, "cpu_milli") < 0
        || same_length(&held[GPU_MILLI], "gpu_milli", specs, "cpu_milli") < 0
        || same_length(&held[POPULARITY], "popularity", specs, "cpu_milli") < 0
        || same_length(&held[ALLOWED], "allowed", specs, "cpu_milli") < 0)
        return -1;
    w->thresholds = held[THRESHOLDS].view.buf;
    w->threshold_of = held[THRESHOLD_OF].view.buf;
    w->cpu_milli = held[CPU_MILLI].view.buf;
    w->num_gpu = held[NUM_GPU].view.buf;
    w->gpu_milli = held[GPU_MILLI].view.buf;
    w->popularity = held[POPULARITY].view.buf;
    w->allowed = held[ALLOWED].view.buf;
    w->levels = held[THRESHOLDS].view.shape[0];
    w->specs = specs;
    w->products = held[ALLOWED].view.shape[1];
    w->constrained = constrained;
    r->rows = rows;
    r->width = held[FREE].view.shape[1];
    r->free_ = held[FREE].view.buf;
    r->cpu_left = held[CPU_LEFT].view.buf;
    r->product = held[PRODUCT].view.buf;
    r->out = held[OUT].view.buf;
    for (Py_ssize_t m = 0; m < specs; m++) {
        if (w->gpu_milli[m] != 0 && (w->threshold_of[m] < 0 || w->threshold_of[m] >= w->levels)) {
            PyErr_Format(PyExc_ValueError, "threshold_of[%zd] = %lld outside 0..%zd", m,
                         (long long)w->threshold_of[m], w->levels - 1);
            return -1;
        }
    }
    if (constrained) {
        const int64_t *product = held[PRODUCT].view.buf;
        for (Py_ssize_t r = 0; r < rows; r++) {
            if (product[r] < 0 || product[r] >= w->products) {
                PyErr_Format(PyExc_ValueError, "product[%zd] = %lld outside 0..%zd", r,
                             (long long)product[r], w->products - 1);
                return -1;
            }
        }
    }
    return 0;
}

static PyObject *frag_rows(PyObject *self, PyObject *args) {
    PyObject *obj[NBUF];
    int constrained;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOpO:frag_rows", &obj[FREE], &obj[CPU_LEFT],
                          &obj[PRODUCT], &obj[THRESHOLDS], &obj[THRESHOLD_OF],
                          &obj[CPU_MILLI], &obj[NUM_GPU], &obj[GPU_MILLI], &obj[POPULARITY],
                          &obj[ALLOWED], &constrained, &obj[OUT]))
        return NULL;
    Held held[NBUF];
    Specs w;
    Rows x;
    if (acquire_all(obj, held, 1, constrained, &w, &x) < 0) {
        release_all(held, NBUF);
        return NULL;
    }
    int64_t *count = PyMem_RawMalloc(sizeof(int64_t) * (size_t)(2 * w.levels + 1));
    if (count == NULL) {
        release_all(held, NBUF);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < x.rows; r++)
        x.out[r] = frag_one(x.free_ + r * x.width, x.width, x.cpu_left[r], x.product[r], &w,
                            count, count + w.levels);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(count);
    release_all(held, NBUF);
    Py_RETURN_NONE;
}

/* F of each row before and after one pod is placed on it, in one call (the numpy form of each
 * move is in scheduler/core/fragmentation.py, fragmentation_before_after):
 *   whole_gpus < 0: a share of one GPU: out is rows x (1 + width); column 0 is F as the row
 *     is, column 1 + g is F with take_milli off GPU g (on every GPU, fitting or not) and
 *     take_cpu off the CPU;
 *   whole_gpus >= 0: out is rows x 2; column 1 is F with take_milli off each of the first
 *     whole_gpus GPUs whose free share is `full` (fewer when the row has fewer) and take_cpu
 *     off the CPU. */
static PyObject *frag_before_after(PyObject *self, PyObject *args) {
    PyObject *obj[NBUF];
    int constrained;
    long long take_milli, take_cpu, whole_gpus, full;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOpLLLLO:frag_before_after", &obj[FREE],
                          &obj[CPU_LEFT], &obj[PRODUCT], &obj[THRESHOLDS], &obj[THRESHOLD_OF],
                          &obj[CPU_MILLI], &obj[NUM_GPU], &obj[GPU_MILLI], &obj[POPULARITY],
                          &obj[ALLOWED], &constrained, &take_milli, &take_cpu, &whole_gpus,
                          &full, &obj[OUT]))
        return NULL;
    Held held[NBUF];
    Specs w;
    Rows x;
    if (acquire_all(obj, held, 2, constrained, &w, &x) < 0) {
        release_all(held, NBUF);
        return NULL;
    }
    const Py_ssize_t rows = x.rows, width = x.width;
    const Py_ssize_t cols = whole_gpus < 0 ? width + 1 : 2;
    if (held[OUT].view.shape[1] != cols) {
        PyErr_Format(PyExc_ValueError, "out has %zd columns, %zd expected", held[OUT].view.shape[1],
                     cols);
        release_all(held, NBUF);
        return NULL;
    }
    const int64_t *free_ = x.free_, *cpu_left = x.cpu_left, *product = x.product;
    double *out = x.out;
    int64_t *count = PyMem_RawMalloc(sizeof(int64_t) * (size_t)(2 * w.levels + width + 1));
    if (count == NULL) {
        release_all(held, NBUF);
        return PyErr_NoMemory();
    }
    int64_t *fitted = count + w.levels, *moved = count + 2 * w.levels;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int64_t *row = free_ + r * width;
        double *o = out + r * cols;
        o[0] = frag_one(row, width, cpu_left[r], product[r], &w, count, fitted);
        memcpy(moved, row, sizeof(int64_t) * (size_t)width);
        if (whole_gpus < 0) {
            for (Py_ssize_t g = 0; g < width; g++) {
                moved[g] = row[g] - take_milli;
                o[1 + g] = frag_one(moved, width, cpu_left[r] - take_cpu, product[r], &w, count,
                                    fitted);
                moved[g] = row[g];
            }
        } else {
            long long left = whole_gpus;
            for (Py_ssize_t g = 0; g < width && left > 0; g++) {
                if (row[g] == full) {
                    moved[g] = row[g] - take_milli;
                    left--;
                }
            }
            o[1] = frag_one(moved, width, cpu_left[r] - take_cpu, product[r], &w, count, fitted);
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(count);
    release_all(held, NBUF);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"frag_rows", frag_rows, METH_VARARGS,
     "frag_rows(free, cpu_left, product, thresholds, threshold_of, cpu_milli, num_gpu, "
     "gpu_milli, popularity, allowed, constrained, out) -> None: F of each row of free into "
     "out (see scheduler/core/fragkernel.py)."},
    {"frag_before_after", frag_before_after, METH_VARARGS,
     "frag_before_after(free, cpu_left, product, thresholds, threshold_of, cpu_milli, "
     "num_gpu, gpu_milli, popularity, allowed, constrained, take_milli, take_cpu, whole_gpus, "
     "full, out) -> None: F of each row before and after one pod (see _fragkernel.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fragkernel",
    "FGD's fragmentation kernel, compiled ahead of time (scheduler/core/fragkernel.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fragkernel(void) { return PyModule_Create(&module); }

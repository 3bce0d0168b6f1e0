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

enum { FREE, CPU_LEFT, PRODUCT, THRESHOLDS, THRESHOLD_OF, CPU_MILLI, NUM_GPU, GPU_MILLI,
       POPULARITY, ALLOWED, OUT, NBUF };

static PyObject *frag_rows(PyObject *self, PyObject *args) {
    PyObject *obj[NBUF];
    int constrained;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOpO:frag_rows", &obj[FREE], &obj[CPU_LEFT],
                          &obj[PRODUCT], &obj[THRESHOLDS], &obj[THRESHOLD_OF],
                          &obj[CPU_MILLI], &obj[NUM_GPU], &obj[GPU_MILLI], &obj[POPULARITY],
                          &obj[ALLOWED], &constrained, &obj[OUT]))
        return NULL;
    static const char *names[NBUF] = {"free", "cpu_left", "product", "thresholds",
                                      "threshold_of", "cpu_milli", "num_gpu", "gpu_milli",
                                      "popularity", "allowed", "out"};
    static const int dims[NBUF] = {2, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1};
    static const char kinds[NBUF] = {'i', 'i', 'i', 'i', 'i', 'i', 'i', 'i', 'd', '?', 'd'};
    Held held[NBUF];
    memset(held, 0, sizeof held);
    for (int i = 0; i < NBUF; i++) {
        if (acquire(obj[i], &held[i], names[i], dims[i], kinds[i], i == OUT) < 0) {
            release_all(held, NBUF);
            return NULL;
        }
    }
    const Py_ssize_t rows = held[FREE].view.shape[0], width = held[FREE].view.shape[1];
    const Py_ssize_t levels = held[THRESHOLDS].view.shape[0];
    const Py_ssize_t specs = held[CPU_MILLI].view.shape[0];
    const Py_ssize_t products = held[ALLOWED].view.shape[1];
    if (same_length(&held[CPU_LEFT], "cpu_left", rows, "free") < 0
        || same_length(&held[PRODUCT], "product", rows, "free") < 0
        || same_length(&held[OUT], "out", rows, "free") < 0
        || same_length(&held[THRESHOLD_OF], "threshold_of", specs, "cpu_milli") < 0
        || same_length(&held[NUM_GPU], "num_gpu", specs, "cpu_milli") < 0
        || same_length(&held[GPU_MILLI], "gpu_milli", specs, "cpu_milli") < 0
        || same_length(&held[POPULARITY], "popularity", specs, "cpu_milli") < 0
        || same_length(&held[ALLOWED], "allowed", specs, "cpu_milli") < 0) {
        release_all(held, NBUF);
        return NULL;
    }
    const int64_t *free_ = held[FREE].view.buf, *cpu_left = held[CPU_LEFT].view.buf;
    const int64_t *product = held[PRODUCT].view.buf, *thresholds = held[THRESHOLDS].view.buf;
    const int64_t *threshold_of = held[THRESHOLD_OF].view.buf;
    const int64_t *cpu_milli = held[CPU_MILLI].view.buf, *num_gpu = held[NUM_GPU].view.buf;
    const int64_t *gpu_milli = held[GPU_MILLI].view.buf;
    const double *popularity = held[POPULARITY].view.buf;
    const unsigned char *allowed = held[ALLOWED].view.buf;
    double *out = held[OUT].view.buf;
    for (Py_ssize_t m = 0; m < specs; m++) {
        if (gpu_milli[m] != 0 && (threshold_of[m] < 0 || threshold_of[m] >= levels)) {
            PyErr_Format(PyExc_ValueError, "threshold_of[%zd] = %lld outside 0..%zd", m,
                         (long long)threshold_of[m], levels - 1);
            release_all(held, NBUF);
            return NULL;
        }
    }
    if (constrained) {
        for (Py_ssize_t r = 0; r < rows; r++) {
            if (product[r] < 0 || product[r] >= products) {
                PyErr_Format(PyExc_ValueError, "product[%zd] = %lld outside 0..%zd", r,
                             (long long)product[r], products - 1);
                release_all(held, NBUF);
                return NULL;
            }
        }
    }
    int64_t *count = PyMem_RawMalloc(sizeof(int64_t) * (size_t)(2 * levels + 1));
    if (count == NULL) {
        release_all(held, NBUF);
        return PyErr_NoMemory();
    }
    int64_t *fitted = count + levels;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int64_t *row = free_ + r * width;
        int64_t total = 0;
        for (Py_ssize_t g = 0; g < width; g++) total += row[g];
        for (Py_ssize_t d = 0; d < levels; d++) {
            int64_t c = 0, s = 0, t = thresholds[d];
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
        const int64_t cpu = cpu_left[r];
        for (Py_ssize_t m = 0; m < specs; m++) {
            const double p = popularity[m];
            const int cpu_ok = cpu >= cpu_milli[m];
            if (gpu_milli[m] == 0) {
                if (cpu_ok) cpu_fits += p * whole;
                else cpu_lacks += p * whole;
                continue;
            }
            if (constrained && !allowed[m * products + product[r]]) {
                no_access += p * whole;
                continue;
            }
            const Py_ssize_t d = (Py_ssize_t)threshold_of[m];
            const int host = count[d] >= num_gpu[m];
            if (cpu_ok) {
                if (host) lack_gpu += p * (double)(total - fitted[d]);
                else lack_gpu += p * whole;
            } else if (host) {
                lack_cpu += p * whole;
            } else {
                lack_both += p * whole;
            }
        }
        out[r] = lack_both + lack_gpu + lack_cpu + cpu_fits + cpu_lacks + no_access;
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
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fragkernel",
    "FGD's fragmentation kernel, compiled ahead of time (scheduler/core/fragkernel.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fragkernel(void) { return PyModule_Create(&module); }

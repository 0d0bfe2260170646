/* opcoverage.c -- prints each op's inputs and attributes (from the attribute schema,
 * tdd_op_schema) and the op x backend x dtype coverage table (markdown) from the op
 * table, each backend's supports() and the cpu backend's native-kernel rule, using the
 * conformance suite's cases as sample calls; the cuda column runs each call on cuda:0 of
 * the emulated build (`make emu`), so the table reads the same on every machine.
 *
 *   opcoverage [OPINFO_COUNTS]   (the line tests/python/test_opinfo.py holds its counts to)
 *
 * docs/ops.md is its output (`make docs`); never edit that file by hand. */
#include <stdio.h>
#include <string.h>

#include "../tests/unit/test_conformance.h"

static const char *kind_name(tdd_opkind k)
{
    switch (k) {
    case TDD_KIND_BINARY:
        return "binary";
    case TDD_KIND_UNARY:
        return "unary";
    case TDD_KIND_ELEMENT:
        return "elementwise";
    case TDD_KIND_REDUCE:
        return "reduction";
    case TDD_KIND_LINALG:
        return "linalg";
    case TDD_KIND_VIEW:
        return "view";
    case TDD_KIND_INDEX:
        return "indexing";
    case TDD_KIND_NN:
        return "nn";
    case TDD_KIND_CREATE:
        return "creation";
    }
    return "?";
}

/* A table cell: '|' would end it. */
static void cell(const char *s)
{
    for (; s && *s; s++)
        if (*s == '|')
            fputs("\\|", stdout);
        else
            putchar(*s);
}

/* Each op's inputs and attributes, from the schema tdd_op_prepare checks requests against. */
static void print_schema(void)
{
    printf("\n## Inputs and attributes\n\n"
           "From the attribute schema (`tdd_op_schema`, backends/ops.c) that every request is\n"
           "checked against before anything is queued: an attribute the op does not take, one\n"
           "of the wrong type or one given twice is INVALID_ARGUMENT naming it. Types: int\n"
           "(a bool reads as 0/1), number (int, float or bool), bool (an int reads as\n"
           "nonzero), int list (a single int is a list of one), int or int list, string.\n"
           "Dims may be negative (counted from the end). Creation ops also take the dtype as\n"
           "the request's dtype field (the Python client's `dtype=`), and run on the\n"
           "request's device; random ops draw from the session's random stream.\n\n"
           "| op | inputs | attributes (type, default or required, accepted values) |\n"
           "|---|---|---|\n");
    for (int op = 0; op < TDD_OP_COUNT; op++) {
        const tdd_opschema *sc = &tdd_op_schema[op];
        printf("| %s | ", tdd_opdefs[op].name);
        cell(sc->inputs && sc->inputs[0] ? sc->inputs : "none");
        printf(" | ");
        if (sc->n_attrs == 0)
            printf("none");
        for (int i = 0; i < sc->n_attrs; i++) {
            const tdd_attrdef *a = &sc->attrs[i];
            static const char *const tys[] = {
                [TDD_AT_INT] = "int",       [TDD_AT_NUM] = "number",
                [TDD_AT_BOOL] = "bool",     [TDD_AT_INT_OR_INTS] = "int or int list",
                [TDD_AT_INTS] = "int list", [TDD_AT_FLOATS] = "float list",
                [TDD_AT_STR] = "string",    [TDD_AT_INTS_OR_STR] = "int, int list or string"};
            const char *ty = tys[a->type];
            printf("%s`%s`: %s, ", i ? "<br>" : "", a->name, ty);
            if (a->required)
                printf("required");
            else {
                printf("default ");
                cell(a->def);
            }
            if (a->bounds) {
                printf("; ");
                cell(a->bounds);
            }
        }
        if (sc->ordered) {
            printf("<br>expects ");
            cell(sc->ordered);
        }
        printf(" |\n");
    }
}

static const td_dtype dtypes[] = {TD_F32, TD_F64,  TD_F16, TD_BF16, TD_I32,
                                  TD_I64, TD_BOOL, TD_U8,  TD_I8,   TD_I16};
static const char letters[] = "sdhbilouc"
                              "w";

/* The PyTorch comparison's counts, one line (file missing or empty: NULL). */
static char *read_line(const char *path, char *buf, size_t len)
{
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return NULL;
    char *r = fgets(buf, (int)len, f);
    fclose(f);
    if (!r)
        return NULL;
    buf[strcspn(buf, "\n")] = '\0';
    return buf[0] ? buf : NULL;
}

int main(int argc, char **argv)
{
    /* one emulated device in the `make emu` build (elsewhere the cuda backend ignores it) */
    tdd_backend_config cfg = {.cpu_devices = 1, .threads = 1, .emu_gpus = 1};
    conf_backend ref = {&tdd_backend_ref, NULL}, cpu = {&tdd_backend_cpu, NULL};
    conf_backend cuda = {&tdd_backend_cuda, NULL};
    char why[128] = "";
    if (ref.be->init(&cfg, &ref.ctx, NULL, 0) < 1 || cpu.be->init(&cfg, &cpu.ctx, NULL, 0) < 1)
        return 1;
    if (cuda.be->init(&cfg, &cuda.ctx, why, sizeof why) < 1 || !cuda.be->execute) {
        fprintf(stderr,
                "opcoverage: no cuda device (%s); the table comes from the emulated build: "
                "make docs\n",
                why[0] ? why : "none");
        return 1;
    }

    printf("# Op coverage\n\n"
           "Generated by `tools/opcoverage` from the op table (backends/ops.h), each backend's\n"
           "`supports()` and the cpu backend's native-kernel rule (`tdd_cpu_native`), with the\n"
           "conformance suite's cases (tests/unit/test_conformance_cases.c) as sample calls.\n"
           "Do not edit by hand: `make docs` writes it, `make test-docs` checks it.\n\n"
           "Each cell is `ref · cpu · cuda`:\n\n"
           "- ref: `✓` runs (the reference kernel: every dtype the op accepts);\n"
           "- cpu: `fast` = threaded/vectorised or BLAS kernel, `ref` = runs the reference\n"
           "  kernel (single-threaded) because no fast kernel exists yet for that op/dtype;\n"
           "- cuda: `✓` the sample call ran on cuda:0 with ref's outcome, `–` the backend\n"
           "  declines it (the daemon answers UNSUPPORTED_*), `✗` it was accepted but failed.\n"
           "  The cuda backend here is the `make emu` build: backends/cuda's kernels and host\n"
           "  code compiled by the host compilers against the CUDA emulator\n"
           "  (backends/cuda/emu), the code nvcc compiles, so the column is the same on every\n"
           "  machine; the GPU suites (tests/gpu) hold its values to ref;\n"
           "- `–` alone: the op rejects the dtype with UNSUPPORTED_DTYPE (as PyTorch does), or\n"
           "  the dtype does not apply (index inputs, fixed output dtypes);\n"
           "- `†`: the dtype is in the conformance suite for this op (cpu and cuda compared\n"
           "  with ref).\n\n");
    printf("| op | kind |");
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        printf(" %s |", td_dtype_name(dtypes[d]));
    printf("\n|---|---|");
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        printf("---|");
    printf("\n");
    int fast = 0, n_ref = 0, n_cpu = 0, n_cuda = 0;
    for (int op = 0; op < TDD_OP_COUNT; op++) {
        const tdd_opdef *def = &tdd_opdefs[op];
        const conf_case *sample = NULL;
        for (int i = 0; i < conf_ncases && !sample; i++)
            if (strcmp(conf_cases[i].op, def->name) == 0)
                sample = &conf_cases[i];
        printf("| %s | %s |", def->name, kind_name(def->kind));
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
            if (!sample) {
                printf(" ? |");
                continue;
            }
            /* ops with no dtype choice (one_hot, arange default) run once, as int64 */
            bool fixed = sample->dtypes[0] == '\0';
            td_dtype dt = fixed ? TD_DTYPE_INVALID : dtypes[d];
            bool tested = false;
            /* the call: the op's first case written for this dtype, else its first case
             * (sub's first case has a float alpha, which integer inputs rightly refuse) */
            const conf_case *call = sample;
            for (int i = 0; i < conf_ncases; i++)
                if (strcmp(conf_cases[i].op, def->name) == 0 &&
                    strchr(conf_cases[i].dtypes, letters[d])) {
                    if (!tested)
                        call = &conf_cases[i];
                    tested = true;
                }
            conf_result r;
            conf_run(call, dt, 0, &ref, &cpu, false, &r);
            if (fixed && dtypes[d] != TD_I64) {
                printf(" – |");
                continue;
            }
            if (fixed)
                tested = true;
            if (r.prep_rc != 0) {
                printf(" – |");
                continue;
            }
            n_ref++;
            n_cpu += r.supported[1] != 0;
            fast += r.supported[1] && r.native;
            printf(" ✓ · %s", r.supported[1] ? (r.native ? "fast" : "ref") : "–");
            conf_result rc;
            conf_run(call, dt, 0, &ref, &cuda, true, &rc);
            /* ran: as ref did (both 0, or both refused the sample's values alike, as pow of
             * ints to negative powers) */
            bool ran = rc.supported[1] && rc.rc[1] == rc.rc[0];
            n_cuda += ran;
            printf(" · %s", rc.supported[1] ? (ran ? "✓" : "✗") : "–");
            printf("%s |", tested ? " †" : "");
        }
        printf("\n");
    }
    print_schema();
    printf("\n## Counts\n\n"
           "%d ops; %d op × dtype × backend cells run: ref %d, cpu %d (%d with a fast "
           "kernel), cuda %d.\n",
           TDD_OP_COUNT, n_ref + n_cpu + n_cuda, n_ref, n_cpu, fast, n_cuda);
    char counts[512];
    if (read_line(argc > 1 ? argv[1] : NULL, counts, sizeof counts))
        printf("\nAgainst PyTorch's own OpInfo sample inputs (torch 1.13, on cpu:0;\n"
               "tests/python/test_opinfo.py, which holds these counts): %s.\n",
               counts);
    ref.be->shutdown(ref.ctx);
    cpu.be->shutdown(cpu.ctx);
    cuda.be->shutdown(cuda.ctx);
    return 0;
}

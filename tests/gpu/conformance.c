/* conformance.c -- the conformance table (tests/unit/test_conformance_cases.c, and the
 * larger shapes below) on cuda:0, held to ref for every op x dtype the cuda backend supports, as
 * written and with non-contiguous inputs. Prints what ran and what the backend declined; exits 1 on
 * any mismatch or error, 2 when there is no CUDA device (a real one, or the emulator's from
 * TDD_EMU_GPUS in the `make emu` build).
 *
 *   build/emu/tests/gpu_conformance [-v] [OP...]   (-v: every case; OPs: only those rows) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/test_conformance.h"

/* Shapes that reach the paths small tables miss: block reductions with several strides per
 * thread and idle threads, split reductions (partials), rows longer than a block, several
 * warp tiles of a scan, GEMMs whose sizes are not multiples of anything. */
static const conf_case gpu_cases[] = {
    {"softmax", {"x:3,700"}, "dim=1", "s", 1},
    {"log_softmax", {"x:4,300"}, "dim=1", "s", 1},
    {"softmax", {"x:5,33"}, "dim=1", "s", 1},
    {"cumsum", {"x:3,100"}, "dim=1", "s", 1},
    {"argmax", {"x:5,1000"}, "dim=1", "s", 1},
    {"argmin", {"x:3,257"}, "dim=1", "s", 1},
    {"amin", {"x:2,5000"}, "dim=1", "s", 1},
    {"logsumexp", {"x:3,2000"}, "dim=1", "s", 1},
    {"var", {"x:2,3000"}, "dim=1", "s", 1},
    {"std", {"x:4000"}, "", "s", 1},
    {"mean", {"x:7,33"}, "dim=1", "s", 1},
    {"prod", {"p:2,40"}, "dim=1", "s", 1},
    {"sum", {"x:64,40"}, "dim=0", "s", 1},
    {"sum", {"x:100000"}, "", "s", 10},
    {"matmul", {"x:33,17", "x:17,65"}, "", "s", 5},
    /* f32 sums of 17 vs ref's */ {"bmm", {"x:3,5,7", "x:3,7,4"}, "", "s", 1},
    /* rows longer than a block (several strides per thread), several rows per launch */
    {"cross_entropy", {"x:6,700", "i700:6"}, "label_smoothing=0.2", "sd", 2},
    {"cross_entropy", {"x:40,33", "i33:40"}, "reduction='sum';ignore_index=5", "s", 2},
    {"nll_loss", {"x:300,7", "i7:300"}, "", "s", 2},
    {"layer_norm", {"x:3,700", "x:700", "x:700"}, "normalized_shape=[700]", "sd", 2},
    {"mse_loss", {"x:50,90", "x:50,90"}, "", "s", 5},
    /* index moves: many colliding atomics, strided indices, any element size */
    {"scatter_add", {"x:4,40", "i4:300,40", "x:300,40"}, "dim=0", "sdl", 5},
    {"gather", {"x:50,30", "i30:50,60"}, "dim=1", "sho", 1},
    {"index_select", {"x:20,300", "i20:70"}, "dim=0", "sb", 1},
    {"embedding", {"i100:7,9", "x:100,33"}, "", "s", 1},
    /* embedding_bag (+ backward's atomics on shared rows), multinomial's draws */
    {"embedding_bag", {"i50:300", "x:50,33", "o300:40"}, "mode='mean';padding_idx=7", "sd", 1},
    {"embedding_bag", {"i50:300", "x:50,33", "o300:40", "x:300"}, "mode='sum'", "sd", 1},
    {"embedding_bag", {"i50:300", "x:50,33", "o300:40"}, "mode='max'", "sd", 1},
    {"embedding_bag_backward", {"x:40,33", "i50:300", "o300:40", "x:50,33"}, "mode='sum'", "sd", 2},
    {"embedding_bag_backward", {"x:40,33", "i50:300", "o300:40", "x:50,33"}, "mode='max'", "sd", 1},
    {"multinomial", {"p:40,30"}, "num_samples=20", "sd", 0},
    {"multinomial", {"p:40,30"}, "num_samples=50;replacement=true", "sd", 0},
    /* im2col + strided-batched GEMM with groups, several batches */
    {"conv2d", {"x:3,6,11,9", "x:8,3,3,3", "x:8"}, "groups=2;padding=1;stride=[1,2]", "s", 30},
    {"max_pool2d", {"x:2,3,17,13"}, "kernel_size=[3,2];stride=2;dilation=[1,2]", "sd", 1},
    {"avg_pool2d", {"x:2,3,17,13"}, "kernel_size=3;padding=1;count_include_pad=false", "s", 1},
    /* f64 and integer GEMMs (tdc_gemm) with broadcast batch dims */
    {"matmul", {"x:2,1,9,13", "x:3,13,5"}, "", "dl", 1},
    {"sum", {"x:3,5000"}, "dim=1", "dl", 1},
};

int main(int argc, char **argv)
{
    int verbose = 0, nsel = 0;
    const char *sel[64];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v"))
            verbose = 1;
        else if (nsel < 64)
            sel[nsel++] = argv[i];
    }
    tdd_backend_config cfg = {.cpu_devices = 1, .threads = 1, .sim_devices = 0};
    conf_backend ref = {.be = &tdd_backend_ref}, cuda = {.be = &tdd_backend_cuda};
    char why[256] = "";
    if (ref.be->init(&cfg, &ref.ctx, NULL, 0) < 1) {
        fprintf(stderr, "gpu conformance: the ref backend did not start\n");
        return 1;
    }
    if (cuda.be->init(&cfg, &cuda.ctx, why, sizeof why) < 1 || !cuda.be->execute) {
        fprintf(stderr, "gpu conformance: no CUDA device: %s\n", why);
        return 2;
    }
    char name[256];
    cuda.be->device_name(cuda.ctx, 0, name, sizeof name);
    int cases = 0, runs = 0, declined = 0, failures = 0, rows = 0;
    const int ngpu = (int)(sizeof gpu_cases / sizeof gpu_cases[0]);
    for (int k = 0; k < conf_ncases + ngpu; k++) {
        const conf_case *c = k < conf_ncases ? &conf_cases[k] : &gpu_cases[k - conf_ncases];
        if (nsel) {
            int hit = 0;
            for (int s = 0; s < nsel; s++)
                hit |= !strcmp(sel[s], c->op);
            if (!hit)
                continue;
        }
        const char *dts = c->dtypes[0] ? c->dtypes : "-";
        int row_ran = 0;
        for (const char *l = dts; *l; l++) {
            td_dtype dt = *l == '-' ? TD_DTYPE_INVALID : conf_dtype_of(*l);
            int ran = 0;
            for (int variant = 0; variant < 2; variant++) {
                conf_result r;
                conf_run(c, dt, variant, &ref, &cuda, true, &r);
                if (r.prep_rc == 0 && r.rc[0] == 0 && !r.supported[1])
                    continue; /* declined (typed); the unit suite checks the refusal */
                bool ok = r.prep_rc == 0 && r.rc[0] == 0 && r.rc[1] == 0 && r.bad == 0;
                runs++;
                ran = 1;
                if (!ok) {
                    failures++;
                    fprintf(stderr,
                            "FAIL cuda:0 %s [%s] %s variant %d: prep %s, ref %s, cuda %s: %s\n",
                            c->op, c->attrs, td_dtype_name(dt), variant, td_err_name(r.prep_rc),
                            td_err_name(r.rc[0]), td_err_name(r.rc[1]), r.msg);
                } else if (verbose) {
                    printf("ok   cuda:0 %s [%s] %s variant %d\n", c->op, c->attrs,
                           td_dtype_name(dt), variant);
                }
            }
            cases += ran;
            declined += !ran;
            if (!ran && verbose)
                printf("declined cuda:0 %s [%s] %s\n", c->op, c->attrs, td_dtype_name(dt));
            row_ran |= ran;
        }
        rows += row_ran;
    }
    printf("gpu conformance on cuda:0 (%s): %d op x dtype cases of %d table rows held to ref "
           "(%d runs with the strided variants), %d failing; %d op x dtype cases declined "
           "(not on cuda yet)\n",
           name, cases, rows, runs, failures, declined);
    cuda.be->shutdown(cuda.ctx);
    ref.be->shutdown(ref.ctx);
    return failures ? 1 : 0;
}

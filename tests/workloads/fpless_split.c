// Ground truth for unwinding without frame pointers (built with -O2 -fomit-frame-pointer).
//
// A worker thread spends its CPU in one leaf, reached through two call paths, path_alpha and
// path_beta, in a ratio set on the command line. Only a whole stack (leaf → path → worker →
// start_thread → clone3) tells the paths apart: the leaf is the same. The thread's CPU time in each
// path is measured with CLOCK_THREAD_CPUTIME_ID and printed at the end as the truth.
//
// usage: fpless_split SECONDS ALPHA_WEIGHT BETA_WEIGHT
// prints "ready" when working, then "alpha_ns beta_ns" after SECONDS, then exits at the end of stdin
// (so a test can still name the addresses of the process).
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double seconds, weights[2];
static long long spent_ns[2];

static long long thread_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return now.tv_sec * 1000000000LL + now.tv_nsec;
}

__attribute__((noinline)) double leaf(long iterations, double seed) {
    double x = seed;
    for (long i = 0; i < iterations; i++)
        x = x * 1.0000001 + 0.5 / (x + 1.0);
    return x;
}

// Different frame sizes so the two paths have different CFA rules; the volatile locals keep them.
__attribute__((noinline)) double path_alpha(long iterations) {
    volatile double scratch[7];
    scratch[0] = (double)iterations;
    double result = leaf(iterations, scratch[0]);
    scratch[6] = result;
    return scratch[6] + scratch[0];
}

__attribute__((noinline)) double path_beta(long iterations) {
    volatile double scratch[29];
    scratch[3] = (double)iterations;
    double result = leaf(iterations, scratch[3] + 1.0);
    scratch[28] = result;
    return scratch[28] - scratch[3];
}

static void *worker(void *unused) {
    (void)unused;
    double sink = 0;
    long long began = thread_ns();
    double total = weights[0] + weights[1];
    long slot = 0;
    while (thread_ns() - began < (long long)(seconds * 1e9)) {
        // Deterministic interleaving in the asked ratio, in slices of about a millisecond.
        int which = ((long)((slot + 1) * weights[1] / total) != (long)(slot * weights[1] / total)) ? 1 : 0;
        long long t0 = thread_ns();
        sink += which ? path_beta(200000) : path_alpha(200000);
        spent_ns[which] += thread_ns() - t0;
        slot++;
    }
    return (void *)(long)(sink > 0);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SECONDS ALPHA_WEIGHT BETA_WEIGHT\n", argv[0]);
        return 2;
    }
    seconds = atof(argv[1]);
    weights[0] = atof(argv[2]);
    weights[1] = atof(argv[3]);
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, NULL) != 0)
        return 1;
    printf("ready\n");
    fflush(stdout);
    pthread_join(thread, NULL);
    printf("%lld %lld\n", spent_ns[0], spent_ns[1]);
    fflush(stdout);
    while (getchar() != EOF)
        ;
    return 0;
}

// The machine's memory read bandwidth: `read_bandwidth THREADS` reads a buffer much
// larger than the caches with THREADS threads and prints the best rate of several
// passes — the ceiling of a decode that reads all its weights once a token
// (bench/generate.sh prints it beside each program's rate). Each thread reads its share
// in STREAMS runs side by side, as the matrix-vector kernels read several rows at once:
// more of the hardware's prefetchers are busy than with one run (here 53 GB/s against
// 38 on Zen 5, 2 threads). The sums keep the compiler from dropping the reads;
// `-O3 -march=native` vectorizes them.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { STREAMS = 4, LANES = 16, PASSES = 20 };
static const size_t BYTES = (size_t)512 << 20;
static uint64_t *buffer;
static volatile uint64_t sink;

struct part { size_t begin, end; uint64_t sum; };

static void *read_part(void *arg) {
    struct part *p = arg;
    size_t run = (p->end - p->begin) / STREAMS / LANES * LANES;
    uint64_t acc[STREAMS][LANES] = {{0}};
    for (size_t i = 0; i < run; i += LANES)
        for (int s = 0; s < STREAMS; s++)
            for (int l = 0; l < LANES; l++) acc[s][l] += buffer[p->begin + s * run + i + l];
    for (int s = 0; s < STREAMS; s++)
        for (int l = 0; l < LANES; l++) p->sum += acc[s][l];
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads < 1 || threads > 64) {
        fprintf(stderr, "read_bandwidth: THREADS is %s, not 1 to 64\n", argv[1]);
        return 2;
    }
    size_t words = BYTES / sizeof(uint64_t);
    buffer = aligned_alloc(4096, BYTES);
    memset(buffer, 1, BYTES);
    double best = 0;
    for (int pass = 0; pass < PASSES; pass++) {
        pthread_t tid[64];
        struct part parts[64];
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int t = 0; t < threads; t++) {
            parts[t] = (struct part){words / threads * t, words / threads * (t + 1), 0};
            pthread_create(&tid[t], NULL, read_part, &parts[t]);
        }
        for (int t = 0; t < threads; t++) { pthread_join(tid[t], NULL); sink += parts[t].sum; }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        if (BYTES / s > best) best = BYTES / s;
    }
    printf("%.1f GB/s (%d threads, best of %d passes over %zu MiB)\n", best / 1e9, threads, PASSES,
           BYTES >> 20);
    return 0;
}

/* Context-switch generators and a hand-off timer for bench/bench_waitfor.py (built with gcc at run
   time; see bench/wfload.py). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long clk(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
/* work: ns of wall time (procs) or of this thread's CPU time (threads: the same CPU per hand-off
   whoever else runs on the machine) */
static void spin(long ns, clockid_t c) {
    if (ns <= 0) return;
    long long end = clk(c) + ns;
    while (clk(c) < end) {}
}
static void xread(int fd) { char c; if (read(fd, &c, 1) != 1) _exit(0); }
static void xwrite(int fd) { char c = 1; if (write(fd, &c, 1) != 1) _exit(0); }
static void wait_stdin(void) { char b[64]; while (read(0, b, sizeof b) > 0) {} }

/* procs NPAIRS WORK_NS: pairs of processes handing a byte back and forth over two pipes, WORK_NS
   of work before each hand-off, until stdin closes */
static int procs(int npairs, long work) {
    pid_t kids[512];
    int n = 0;
    for (int i = 0; i < npairs && n < 510; i++) {
        int a[2], b[2];
        if (pipe(a) || pipe(b)) return 1;
        for (int side = 0; side < 2; side++) {
            pid_t p = fork();
            if (p == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                prctl(PR_SET_NAME, side ? "wf-gen-b" : "wf-gen-a");
                if (side == 0)
                    for (;;) { spin(work, CLOCK_MONOTONIC); xwrite(a[1]); xread(b[0]); }
                for (;;) { xread(a[0]); spin(work, CLOCK_MONOTONIC); xwrite(b[1]); }
            }
            kids[n++] = p;
        }
        close(a[0]); close(a[1]); close(b[0]); close(b[1]);
    }
    printf("ready");
    for (int i = 0; i < n; i++) printf(" %d", kids[i]);
    printf("\n");
    fflush(stdout);
    wait_stdin();
    for (int i = 0; i < n; i++) kill(kids[i], SIGKILL);
    for (int i = 0; i < n; i++) waitpid(kids[i], 0, 0);
    return 0;
}

/* threads NPAIRS WORK_NS PERIOD_NS: one process, NPAIRS pairs of threads; A sleeps to its next
   period, works, hands off to B, which works and hands back (3 voluntary switches a period) */
struct pair { int a[2], b[2]; long work, period; int idx, n; };
static void *thr_a(void *arg) {
    struct pair *p = arg;
    prctl(PR_SET_NAME, "wf-tracked-a");
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    next.tv_nsec += p->period * p->idx / (p->n ? p->n : 1);   /* the pairs spread over the period */
    for (;;) {
        next.tv_nsec += p->period;
        while (next.tv_nsec >= 1000000000L) { next.tv_nsec -= 1000000000L; next.tv_sec++; }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, 0);
        spin(p->work, CLOCK_THREAD_CPUTIME_ID);
        xwrite(p->a[1]);
        xread(p->b[0]);
    }
    return 0;
}
static void *thr_b(void *arg) {
    struct pair *p = arg;
    prctl(PR_SET_NAME, "wf-tracked-b");
    for (;;) { xread(p->a[0]); spin(p->work, CLOCK_THREAD_CPUTIME_ID); xwrite(p->b[1]); }
    return 0;
}
static int threads(int npairs, long work, long period) {
    prctl(PR_SET_NAME, "wf-tracked");
    for (int i = 0; i < npairs; i++) {
        struct pair *p = calloc(1, sizeof *p);
        if (pipe(p->a) || pipe(p->b)) return 1;
        p->work = work; p->period = period; p->idx = i; p->n = npairs;
        pthread_t t;
        pthread_create(&t, 0, thr_b, p);
        pthread_create(&t, 0, thr_a, p);
    }
    printf("ready %d\n", getpid());
    fflush(stdout);
    wait_stdin();
    return 0;
}

/* rtt N: one pair of processes, unthrottled.  Prints "ready"; then for every line read, N round
   trips and "WALL CPU": ns per round trip (two hand-offs: two switches and two wakeups when both
   run on one CPU), wall-clock and CPU time of both processes (this one's clock, the other's
   /proc/PID/schedstat): the CPU figure leaves out the time other tasks of the machine ran */
static long long schedstat_ns(pid_t p) {
    char path[64], buf[128];
    snprintf(path, sizeof path, "/proc/%d/schedstat", p);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    long long v = 0;
    if (fgets(buf, sizeof buf, f)) v = atoll(buf);
    fclose(f);
    return v;
}
static int rtt(long n) {
    int a[2], b[2];
    if (pipe(a) || pipe(b)) return 1;
    pid_t p = fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        prctl(PR_SET_NAME, "wf-rtt-b");
        for (;;) { xread(a[0]); xwrite(b[1]); }
    }
    prctl(PR_SET_NAME, "wf-rtt-a");
    printf("ready %d\n", p);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        for (long i = 0; i < n / 20; i++) { xwrite(a[1]); xread(b[0]); }   /* warm */
        long long c0 = clk(CLOCK_PROCESS_CPUTIME_ID) + schedstat_ns(p), t0 = clk(CLOCK_MONOTONIC);
        for (long i = 0; i < n; i++) { xwrite(a[1]); xread(b[0]); }
        long long t1 = clk(CLOCK_MONOTONIC), c1 = clk(CLOCK_PROCESS_CPUTIME_ID) + schedstat_ns(p);
        printf("%.2f %.2f\n", (double)(t1 - t0) / n, (double)(c1 - c0) / n);
        fflush(stdout);
    }
    kill(p, SIGKILL);
    waitpid(p, 0, 0);
    return 0;
}

/* getpid N: N getpid() syscalls; prints ns per call, wall and CPU */
static int getpid_loop(long n) {
    long long c0 = clk(CLOCK_PROCESS_CPUTIME_ID), t0 = clk(CLOCK_MONOTONIC);
    for (long i = 0; i < n; i++) syscall(39);
    long long t1 = clk(CLOCK_MONOTONIC), c1 = clk(CLOCK_PROCESS_CPUTIME_ID);
    printf("%.2f %.2f\n", (double)(t1 - t0) / n, (double)(c1 - c0) / n);
    return 0;
}

/* udp N: N one-byte datagrams over loopback to a socket of this process that never reads them (full,
   they are dropped): each send runs the network receive softirq in this thread's context on its
   way out (softirq_entry/exit); prints ns per send, wall and CPU */
static int udp_loop(long n) {
    int rx = socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (rx < 0 || tx < 0 || bind(rx, (struct sockaddr *)&a, sizeof a) || getsockname(rx, (struct sockaddr *)&a, &len))
        return 1;
    char c = 1;
    for (long i = 0; i < n / 20; i++) sendto(tx, &c, 1, 0, (struct sockaddr *)&a, sizeof a);   /* warm, fill */
    long long c0 = clk(CLOCK_PROCESS_CPUTIME_ID), t0 = clk(CLOCK_MONOTONIC);
    for (long i = 0; i < n; i++) sendto(tx, &c, 1, 0, (struct sockaddr *)&a, sizeof a);
    long long t1 = clk(CLOCK_MONOTONIC), c1 = clk(CLOCK_PROCESS_CPUTIME_ID);
    printf("%.2f %.2f\n", (double)(t1 - t0) / n, (double)(c1 - c0) / n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "procs")) return procs(atoi(argv[2]), atol(argv[3]));
    if (argc >= 5 && !strcmp(argv[1], "threads")) return threads(atoi(argv[2]), atol(argv[3]), atol(argv[4]));
    if (argc >= 3 && !strcmp(argv[1], "rtt")) return rtt(atol(argv[2]));
    if (argc >= 3 && !strcmp(argv[1], "getpid")) return getpid_loop(atol(argv[2]));
    if (argc >= 3 && !strcmp(argv[1], "udp")) return udp_loop(atol(argv[2]));
    fprintf(stderr, "usage: wfgen procs NPAIRS WORK_NS | threads NPAIRS WORK_NS PERIOD_NS | rtt N | getpid N | udp N\n");
    return 2;
}

/* ---------------------------------------------------------------- wait-for (docs/waitfor.md)
 * Appended to probes.bpf.c by the loader.  For the threads of the processes the agent tracks (the
 * workloads on the accelerators, and the producers they wait on), where each thread's time goes:
 * on a CPU, runnable without a CPU, blocked; and for every blocked interval, the syscall and file
 * descriptor it blocked in and **who ended it** (the waking task, or the interrupt context the
 * wakeup ran in: a softirq vector, a hardware IRQ, an hrtimer).
 *
 * Cost is what decides the shape.  Every context switch on the node enters on_wf_switch, so the
 * test for "is this task tracked" is two bits in plain arrays indexed by pid (no hashing): a
 * process bit (tgid, set by the agent) and a thread bit (set here at a tracked process's thread's
 * first switch, and by the agent for the threads it lists).  Only tracked threads touch a hash.
 * The blocked syscall is read from the task's saved user registers at the switch
 * (bpf_task_pt_regs), so no raw_syscalls probe runs for every syscall of the node.
 *
 * Per thread, wf_cur holds the open interval (state, since) and cumulative totals of closed ones;
 * the agent reads it every tick and adds the open part itself.  Each blocked interval that ends
 * is added to wf_wait under {thread, syscall, fd, waker}; the agent drains wf_wait every tick.
 */
#ifdef WANT_WAITFOR
#define WF_UNKNOWN 0
#define WF_ONCPU 1
#define WF_RUNNABLE 2
#define WF_BLOCKED 3

#define WF_KIND_BLOCKED 0
#define WF_KIND_RUNQ 1   /* reserved: a runnable interval by who took the CPU (not recorded: its cost, bench waitfor) */

/* where a wakeup ran when it was not a task's own doing (wf_key.ctx: kind << 24 | detail) */
#define WF_CTX_SOFTIRQ 1
#define WF_CTX_HARDIRQ 2
#define WF_CTX_HRTIMER 3
#define WF_CTX_NONE 4     /* the wait ended without a wakeup seen (switched in while marked blocked) */

struct wf_cur {
    u64 since;       /* start of the open interval (bpf_ktime_get_ns); 0: not known */
    u64 cpu_ns;      /* closed intervals, cumulative */
    u64 runq_ns;
    u64 blocked_ns;
    u64 switches;
    u32 tgid;
    u32 state;
    s32 nr;          /* blocked: the syscall, -1 none known */
    s32 fd;          /* blocked: its file descriptor argument, -1 none */
    u32 by;          /* runnable after a preemption: the thread that took the CPU */
    u32 pad;
};

struct wf_key {
    u32 tid;
    u32 kind;
    s32 nr;
    s32 fd;
    u32 waker_tgid;
    u32 waker_tid;
    u32 ctx;
    u32 pad;
};

struct wf_val {
    u64 ns;
    u64 count;
};

struct wf_ctx_stack {
    u32 depth;
    u32 top[4];
    u64 at[4];       /* when each was entered: an entry older than WF_CTX_MAX_NS is stale (its exit was missed) */
};
#define WF_CTX_MAX_NS 5000000ULL   /* 5 ms: longer than any softirq run (netdev budget 2 ms), IRQ or hrtimer */

BPF_ARRAY(wf_tgid_bits, u64, WF_BITS_WORDS);
BPF_ARRAY(wf_tid_bits, u64, WF_BITS_WORDS);
BPF_HASH(wf_cur, u32, struct wf_cur, WF_THREADS_MAX);
BPF_HASH(wf_wait, struct wf_key, struct wf_val, WF_WAITS_MAX);
BPF_PERCPU_ARRAY(wf_ctxs, struct wf_ctx_stack, 1);

/* bit `id` of a bit array (one u64 per 64 pids); pids past the array (pid_max raised since the
   program was built) are never tracked */
static __always_inline u64 *wf_tgid_word(u32 id) {
    u32 w = id >> 6;
    return w < WF_BITS_WORDS ? wf_tgid_bits.lookup(&w) : 0;
}
static __always_inline u64 *wf_tid_word(u32 id) {
    u32 w = id >> 6;
    return w < WF_BITS_WORDS ? wf_tid_bits.lookup(&w) : 0;
}
#define WF_BIT(word, id) ((word) && ((*(word) >> ((id) & 63)) & 1))

static __always_inline void wf_add(struct wf_key *k, u64 ns) {
    struct wf_val *v = wf_wait.lookup(k);
    if (v) {
        __sync_fetch_and_add(&v->ns, ns);
        __sync_fetch_and_add(&v->count, 1);
        return;
    }
    struct wf_val init = {.ns = ns, .count = 1};
    if (wf_wait.insert(k, &init) != 0) {
        v = wf_wait.lookup(k);   /* raced with another CPU, or the map is full */
        if (v) {
            __sync_fetch_and_add(&v->ns, ns);
            __sync_fetch_and_add(&v->count, 1);
        } else {
            count(C_WF_LOST, 1);
        }
    }
}

/* the syscall a task blocked in and its fd argument, from its saved user registers */
static __always_inline void wf_blocked_in(struct wf_cur *c) {
    c->nr = -1;
    c->fd = -1;
#if defined(__x86_64__) && !defined(WF_NO_REGS)
    struct task_struct *t = bpf_get_current_task_btf();
    struct pt_regs *r = (struct pt_regs *)bpf_task_pt_regs(t);
    long nr = -1, a0 = -1, a1 = 0;
    bpf_probe_read_kernel(&nr, sizeof(nr), &r->orig_ax);
    bpf_probe_read_kernel(&a0, sizeof(a0), &r->di);
    c->nr = (s32)nr;
    switch (nr) {
    case 0: case 1: case 16: case 17: case 19: case 20: case 42: case 43: case 44: case 45: case 46: case 47:
    case 232: case 281: case 288: case 299: case 307: case 441: case 295:
        /* read write ioctl pread64 readv writev connect accept sendto recvfrom sendmsg recvmsg
           epoll_wait epoll_pwait accept4 recvmmsg sendmmsg epoll_pwait2 preadv: the fd is the first argument */
        c->fd = (s32)a0;
        break;
    case 7: case 271: {
        /* poll / ppoll: the first pollfd's descriptor (a single-socket wait is the common one) */
        bpf_probe_read_kernel(&a1, sizeof(a1), &r->si);
        int fd = -1;
        if (a1 > 0 && bpf_probe_read_user(&fd, sizeof(fd), (void *)a0) == 0)
            c->fd = fd;
        break;
    }
    default:
        break;
    }
#endif
}

int on_wf_switch(struct tracepoint__sched__sched_switch *args) {
    u64 now = 0;
    u64 pt = bpf_get_current_pid_tgid();
    u32 tgid = pt >> 32, tid = (u32)pt;
    /* the task leaving the CPU (the current one) */
    u64 *tw = tid ? wf_tgid_word(tgid) : 0;
    if (WF_BIT(tw, tgid)) {
        struct wf_cur *c = wf_cur.lookup(&tid);
        if (!c) {
            struct wf_cur z = {.tgid = tgid, .nr = -1, .fd = -1};
            if (wf_cur.insert(&tid, &z) != 0)
                count(C_WF_LOST, 1);
            c = wf_cur.lookup(&tid);
        }
        /* its thread bit: set here for a thread the agent has not listed (a new one), and again if
           the agent's read-modify-write of the word raced with it */
        u64 *w = wf_tid_word(tid);
        if (w && !((*w >> (tid & 63)) & 1))
            __sync_fetch_and_or(w, 1ULL << (tid & 63));
        if (c) {
            now = bpf_ktime_get_ns();
            if (c->since && now > c->since)
                c->cpu_ns += now - c->since;   /* it was on a CPU until now, whatever the entry said */
            long st = args->prev_state;
            c->since = now;
            c->switches += 1;
            c->by = 0;
            if ((st & 0xff) == 0) {            /* R or R+ (preempted): runnable */
                c->state = WF_RUNNABLE;
                c->by = args->next_pid;
            } else if (st & 0x30) {            /* X, Z: exiting */
                wf_cur.delete(&tid);
            } else {
                c->state = WF_BLOCKED;
                wf_blocked_in(c);
            }
        }
    }
    /* the task taking the CPU */
    u32 ntid = args->next_pid;
    u64 *nw = ntid ? wf_tid_word(ntid) : 0;
    if (WF_BIT(nw, ntid)) {
        struct wf_cur *n = wf_cur.lookup(&ntid);
        if (n) {
            if (!now)
                now = bpf_ktime_get_ns();
            u64 d = (n->since && now > n->since) ? now - n->since : 0;
            if (n->state == WF_BLOCKED) {      /* its wakeup was not seen */
                struct wf_key k = {.tid = ntid, .kind = WF_KIND_BLOCKED, .nr = n->nr, .fd = n->fd,
                                   .ctx = WF_CTX_NONE << 24};
                n->blocked_ns += d;
                wf_add(&k, d);
            } else {
                /* runnable time is the thread's own total; who held the CPU meanwhile (n->by) is not
                   recorded per interval: a hash update on every preemption of a followed thread cost
                   a quarter of its programs' time (bench waitfor) and nothing read it */
                n->runq_ns += d;
            }
            n->state = WF_ONCPU;
            n->since = now;
            n->by = 0;
        }
    }
    return 0;
}

int on_wf_waking(struct tracepoint__sched__sched_waking *args) {
    u32 tid = args->pid;
    u64 *w = wf_tid_word(tid);
    if (!WF_BIT(w, tid))
        return 0;
    struct wf_cur *c = wf_cur.lookup(&tid);
    if (!c || (c->state != WF_BLOCKED && c->state != WF_UNKNOWN))
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 d = (c->since && now > c->since) ? now - c->since : 0;
    struct wf_key k = {.tid = tid, .kind = WF_KIND_BLOCKED, .nr = c->nr, .fd = c->fd};
    if (c->state == WF_UNKNOWN) {
        k.nr = -1;
        k.fd = -1;
    }
    u32 zero = 0;
    struct wf_ctx_stack *s = wf_ctxs.lookup(&zero);
    if (s && s->depth && s->depth <= 4 && now - s->at[(s->depth - 1) & 3] > WF_CTX_MAX_NS)
        s->depth = 0;       /* an exit was missed (a program attached between an entry and its exit): heal */
    if (s && s->depth) {
        k.ctx = s->top[(s->depth - 1) & 3];
    } else {
        u64 pt = bpf_get_current_pid_tgid();
        k.waker_tgid = pt >> 32;
        k.waker_tid = (u32)pt;
    }
    wf_add(&k, d);
    c->blocked_ns += d;
    c->state = WF_RUNNABLE;
    c->since = now;
    c->by = 0;
    return 0;
}

/* interrupt contexts: a wakeup inside one is the interrupt's, never the interrupted task's */
static __always_inline void wf_push(u32 v) {
    u32 zero = 0;
    struct wf_ctx_stack *s = wf_ctxs.lookup(&zero);
    if (!s)
        return;
    u32 d = s->depth;
    if (d >= 4) {          /* deeper than any real nesting: entries were missed, start again */
        d = 0;
    }
    s->top[d & 3] = v;
    s->at[d & 3] = bpf_ktime_get_ns();
    s->depth = d + 1;
}

static __always_inline void wf_pop(void) {
    u32 zero = 0;
    struct wf_ctx_stack *s = wf_ctxs.lookup(&zero);
    if (s && s->depth)
        s->depth -= 1;
}

int on_wf_softirq_entry(struct tracepoint__irq__softirq_entry *args) {
    wf_push((WF_CTX_SOFTIRQ << 24) | (args->vec & 0xffffff));
    return 0;
}
int on_wf_softirq_exit(struct tracepoint__irq__softirq_exit *args) {
    wf_pop();
    return 0;
}
int on_wf_irq_entry(struct tracepoint__irq__irq_handler_entry *args) {
    wf_push((WF_CTX_HARDIRQ << 24) | ((u32)args->irq & 0xffffff));
    return 0;
}
int on_wf_irq_exit(struct tracepoint__irq__irq_handler_exit *args) {
    wf_pop();
    return 0;
}
int on_wf_hrtimer_entry(struct tracepoint__timer__hrtimer_expire_entry *args) {
    wf_push(WF_CTX_HRTIMER << 24);
    return 0;
}
int on_wf_hrtimer_exit(struct tracepoint__timer__hrtimer_expire_exit *args) {
    wf_pop();
    return 0;
}
#endif

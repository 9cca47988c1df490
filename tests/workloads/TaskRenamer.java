package com.example;

/**
 * Thread-naming test workload: like Spark's executor, a pool of threads named
 * "Executor task launch worker-K" renames each thread per task to
 * "Executor task launch worker for task P.0 in stage S.0 (TID T)" and burns CPU in a method that
 * tells the stage: stage 1 runs burnStageOne, stage 2 burnStageTwo. A sample named with stage S whose
 * stack is in the other stage's method was named with a stale name.
 *
 * A thread with a name longer than the kernel's 15 bytes, "Long-lived background thread named before
 * the window", burns in burnBackground from the start (its name can only come from jcmd).
 *
 * Options: --threads 2 --task-ms 40. Prints READY once every method was compiled; runs until killed.
 */
public final class TaskRenamer {
    static volatile long sink;

    static long burnStageOne(long deadline) {
        long x = 1;
        while (System.nanoTime() < deadline) {
            for (int i = 0; i < 1000; i++) x = x * 6364136223846793005L + 1442695040888963407L;
        }
        return x;
    }

    static long burnStageTwo(long deadline) {
        long x = 3;
        while (System.nanoTime() < deadline) {
            for (int i = 0; i < 1000; i++) x = x * 2862933555777941757L + 3037000493L;
        }
        return x;
    }

    static long burnBackground(long deadline) {
        long x = 7;
        while (System.nanoTime() < deadline) {
            for (int i = 0; i < 1000; i++) x = x * 3935559000370003845L + 2691343689449507681L;
        }
        return x;
    }

    public static void main(String[] args) throws Exception {
        int threads = 2;
        long taskMs = 40;
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (args[i].equals("--threads")) threads = Integer.parseInt(args[i + 1]);
            if (args[i].equals("--task-ms")) taskMs = Long.parseLong(args[i + 1]);
        }
        for (int i = 0; i < 20000; i++) {  // warm up: compile the burners before READY
            long soon = System.nanoTime() + 20_000;
            sink += burnStageOne(soon) + burnStageTwo(soon) + burnBackground(soon);
        }
        Thread background = new Thread(() -> {
            while (true) sink += burnBackground(System.nanoTime() + 5_000_000L);
        }, "Long-lived background thread named before the window");
        background.setDaemon(true);
        background.start();
        final long perTaskNanos = taskMs * 1_000_000L;
        final java.util.concurrent.atomic.AtomicLong nextTid = new java.util.concurrent.atomic.AtomicLong();
        for (int w = 0; w < threads; w++) {
            Thread worker = new Thread(() -> {
                while (true) {
                    long tid = nextTid.getAndIncrement();
                    int stage = (int) (tid / 8 % 2) + 1;
                    Thread.currentThread().setName("Executor task launch worker for task " + (tid % 8) + ".0 in stage "
                        + stage + ".0 (TID " + tid + ")");
                    long deadline = System.nanoTime() + perTaskNanos;
                    sink += stage == 1 ? burnStageOne(deadline) : burnStageTwo(deadline);
                }
            }, "Executor task launch worker-" + w);
            worker.setDaemon(true);
            worker.start();
        }
        System.out.println("READY");
        System.out.flush();
        Thread.sleep(Long.MAX_VALUE);
    }
}

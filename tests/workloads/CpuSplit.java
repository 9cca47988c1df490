package com.example;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * CPU test workload with a known split: worker threads spend CPU in distinct, named methods
 * (burnAlpha, burnBeta, burnGamma, burnDelta) in proportion to given weights, and measure the
 * thread CPU time of every call with ThreadMXBean. That measurement is the truth a profiler is
 * checked against.
 *
 * Options: --weights alpha=50,beta=30,gamma=20  --threads 2  --slice-ms 4  --warmup-ms 3000
 *          --duration-s 0 (0: until "quit")  --depth 0 (extra recursive frames above the burners)
 *
 * Protocol (stdout, one line each): READY once warmed up (JIT-compiled), then on stdin:
 *   reset  -> zero the counters, answer RESET
 *   report -> answer one JSON line {"cpu_seconds": {"burnAlpha": s, ...}, "wall_seconds": s, ...}
 *   quit   -> print a final report and exit
 * Run with -XX:CompileCommand=dontinline,com.example.CpuSplit::* so every method keeps its frame.
 */
public final class CpuSplit {
    static final String[] NAMES = {"alpha", "beta", "gamma", "delta"};
    static final String[] METHODS = {"burnAlpha", "burnBeta", "burnGamma", "burnDelta"};

    static final AtomicLongArray cpuNanos = new AtomicLongArray(NAMES.length);
    static final AtomicLongArray calls = new AtomicLongArray(NAMES.length);
    static volatile long sink;
    static volatile boolean running = true;
    static volatile long resetAtNanos = System.nanoTime();
    static final ThreadMXBean BEAN = ManagementFactory.getThreadMXBean();

    // Each burner does the same arithmetic until its deadline; the names are what differs.
    static long burnAlpha(long deadline, long seed) {
        long x = seed;
        do {
            for (int i = 0; i < 2000; i++) {
                x ^= x << 13; x ^= x >>> 7; x ^= x << 17;
            }
        } while (System.nanoTime() < deadline);
        return x;
    }

    static long burnBeta(long deadline, long seed) {
        long x = seed;
        do {
            for (int i = 0; i < 2000; i++) {
                x ^= x << 13; x ^= x >>> 7; x ^= x << 17;
            }
        } while (System.nanoTime() < deadline);
        return x;
    }

    static long burnGamma(long deadline, long seed) {
        long x = seed;
        do {
            for (int i = 0; i < 2000; i++) {
                x ^= x << 13; x ^= x >>> 7; x ^= x << 17;
            }
        } while (System.nanoTime() < deadline);
        return x;
    }

    static long burnDelta(long deadline, long seed) {
        long x = seed;
        do {
            for (int i = 0; i < 2000; i++) {
                x ^= x << 13; x ^= x >>> 7; x ^= x << 17;
            }
        } while (System.nanoTime() < deadline);
        return x;
    }

    static long burn(int which, long deadline, long seed) {
        switch (which) {
            case 0: return burnAlpha(deadline, seed);
            case 1: return burnBeta(deadline, seed);
            case 2: return burnGamma(deadline, seed);
            default: return burnDelta(deadline, seed);
        }
    }

    /** One round: every method with weight w burns w/sum of a slice, measured in thread CPU time. */
    static void schedule(int[] weights, long sliceNanos) {
        int total = 0;
        for (int w : weights) total += w;
        long seed = Thread.currentThread().getId() * 0x9E3779B97F4A7C15L + 1;
        java.util.SplittableRandom random = new java.util.SplittableRandom(seed);
        while (running) {
            // A random round length (0.5-1.5 slices) and a random first method: a strictly periodic
            // schedule would phase-lock to the scheduler tick (4 ms at HZ=250) under contention, and any
            // sampling profiler aliases with such a workload; real applications are not periodic.
            long round = sliceNanos / 2 + (long) (random.nextDouble() * sliceNanos);
            int first = random.nextInt(weights.length);
            for (int i = 0; i < weights.length; i++) {
                int m = (first + i) % weights.length;
                if (weights[m] <= 0) continue;
                long budget = round * weights[m] / total;
                long before = BEAN.getCurrentThreadCpuTime();
                seed = burn(m, System.nanoTime() + budget, seed);
                long after = BEAN.getCurrentThreadCpuTime();
                cpuNanos.addAndGet(m, after - before);
                calls.incrementAndGet(m);
            }
            sink = seed;
        }
    }

    /** Extra frames between the thread's run() and the burners, for depth-limit tests. */
    static void descend(int depth, int[] weights, long sliceNanos) {
        if (depth > 0) {
            descend(depth - 1, weights, sliceNanos);
        } else {
            schedule(weights, sliceNanos);
        }
    }

    static String report() {
        StringBuilder out = new StringBuilder("{\"cpu_seconds\": {");
        for (int m = 0; m < NAMES.length; m++) {
            if (m > 0) out.append(", ");
            out.append('"').append(METHODS[m]).append("\": ").append(cpuNanos.get(m) / 1e9);
        }
        out.append("}, \"calls\": {");
        for (int m = 0; m < NAMES.length; m++) {
            if (m > 0) out.append(", ");
            out.append('"').append(METHODS[m]).append("\": ").append(calls.get(m));
        }
        out.append("}, \"wall_seconds\": ").append((System.nanoTime() - resetAtNanos) / 1e9);
        out.append(", \"pid\": ").append(ProcessHandle.current().pid()).append('}');
        return out.toString();
    }

    static void reset() {
        for (int m = 0; m < NAMES.length; m++) {
            cpuNanos.set(m, 0);
            calls.set(m, 0);
        }
        resetAtNanos = System.nanoTime();
    }

    static int[] parseWeights(String spec) {
        int[] weights = new int[NAMES.length];
        for (String part : spec.split(",")) {
            String[] kv = part.trim().split("=");
            int index = -1;
            for (int m = 0; m < NAMES.length; m++) {
                if (NAMES[m].equals(kv[0].trim()) || METHODS[m].equals(kv[0].trim())) index = m;
            }
            if (index < 0 || kv.length != 2) {
                throw new IllegalArgumentException("bad weight '" + part + "'; use alpha=50,beta=30,gamma=20,delta=0");
            }
            weights[index] = Integer.parseInt(kv[1].trim());
        }
        return weights;
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> opts = new LinkedHashMap<>();
        opts.put("--weights", "alpha=50,beta=30,gamma=20");
        opts.put("--threads", "2");
        opts.put("--slice-ms", "4");
        opts.put("--warmup-ms", "3000");
        opts.put("--duration-s", "0");
        opts.put("--depth", "0");
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!opts.containsKey(args[i])) throw new IllegalArgumentException("unknown option " + args[i]);
            opts.put(args[i], args[i + 1]);
        }
        final int[] weights = parseWeights(opts.get("--weights"));
        final long sliceNanos = Long.parseLong(opts.get("--slice-ms")) * 1_000_000L;
        final int depth = Integer.parseInt(opts.get("--depth"));
        int threads = Integer.parseInt(opts.get("--threads"));
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            Thread worker = new Thread(() -> descend(depth, weights, sliceNanos), "burner-" + t);
            worker.setDaemon(true);
            worker.start();
            workers.add(worker);
        }
        Thread.sleep(Long.parseLong(opts.get("--warmup-ms")));
        reset();
        System.out.println("READY " + ProcessHandle.current().pid());
        System.out.flush();

        long durationS = Long.parseLong(opts.get("--duration-s"));
        if (durationS > 0) {
            Thread timer = new Thread(() -> {
                try {
                    Thread.sleep(durationS * 1000);
                } catch (InterruptedException e) {
                    return;
                }
                synchronized (System.out) {
                    System.out.println(report());
                    System.out.flush();
                }
                Runtime.getRuntime().halt(0);
            }, "timer");
            timer.setDaemon(true);
            timer.start();
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String command = line.trim();
            synchronized (System.out) {
                if (command.equals("reset")) {
                    reset();
                    System.out.println("RESET");
                } else if (command.equals("report")) {
                    System.out.println(report());
                } else if (command.equals("quit")) {
                    break;
                } else if (!command.isEmpty()) {
                    System.out.println("ERROR unknown command " + command);
                }
                System.out.flush();
            }
        }
        if (line == null && durationS > 0) {
            Thread.sleep(Long.MAX_VALUE);  // stdin closed: the timer ends the run
        }
        running = false;
        for (Thread worker : workers) worker.join(2000);
        System.out.println(report());
        System.out.flush();
    }
}

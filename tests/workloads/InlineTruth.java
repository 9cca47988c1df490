package com.example;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * Ground truth for inlined methods (issue 51): small loop-free kernel methods that C2 inlines into their
 * caller's loop (drive), each given a known share of the workers' CPU. Without -XX:+DebugNonSafepoints
 * C2 records debug information only at the loop's safepoint poll and calls, whose scope is drive: a
 * profiler that takes the nearest PcDesc charges every kernel sample to drive.
 *
 * Each call of drive runs one kernel until its deadline and is measured in thread CPU time
 * (ThreadMXBean), as CpuSplit's burners are. The kernels are dependent multiply/xor-shift chains (about
 * 40 cycles a call), so the loop's own instructions are a few per cent of drive's time at most.
 *
 * Options and protocol as CpuSplit: --weights alpha=50,beta=30,gamma=20 --threads 2 --slice-ms 4
 * --warmup-ms 3000; READY after warm-up, then stdin reset / report / quit. Run it WITHOUT any
 * CompileCommand: the point is that C2 inlines the kernels.
 */
public final class InlineTruth {
    static final String[] NAMES = {"alpha", "beta", "gamma"};
    static final String[] METHODS = {"kernelAlpha", "kernelBeta", "kernelGamma"};
    static final AtomicLongArray cpuNanos = new AtomicLongArray(NAMES.length);
    static final AtomicLongArray calls = new AtomicLongArray(NAMES.length);
    static final ThreadMXBean BEAN = ManagementFactory.getThreadMXBean();
    static volatile long sink;
    static volatile boolean running = true;
    static volatile long resetAtNanos = System.nanoTime();

    // Different constants so that C2 cannot merge the kernels' code.
    static long kernelAlpha(long x) {
        x = (x ^ (x >>> 31)) * 0x9E3779B97F4A7C15L;
        x = (x ^ (x >>> 27)) * 0xBF58476D1CE4E5B9L;
        x = (x ^ (x >>> 33)) * 0x94D049BB133111EBL;
        x = (x ^ (x >>> 29)) * 0xD6E8FEB86659FD93L;
        x = (x ^ (x >>> 31)) * 0xA0761D6478BD642FL;
        x = (x ^ (x >>> 27)) * 0xE7037ED1A0B428DBL;
        x = (x ^ (x >>> 33)) * 0x8EBC6AF09C88C6E3L;
        x = (x ^ (x >>> 29)) * 0x589965CC75374CC3L;
        return x ^ (x >>> 32);
    }

    static long kernelBeta(long x) {
        x = (x ^ (x >>> 30)) * 0xBF58476D1CE4E5B9L;
        x = (x ^ (x >>> 28)) * 0x94D049BB133111EBL;
        x = (x ^ (x >>> 32)) * 0x9E3779B97F4A7C15L;
        x = (x ^ (x >>> 30)) * 0xE7037ED1A0B428DBL;
        x = (x ^ (x >>> 28)) * 0xD6E8FEB86659FD93L;
        x = (x ^ (x >>> 32)) * 0x589965CC75374CC3L;
        x = (x ^ (x >>> 30)) * 0xA0761D6478BD642FL;
        x = (x ^ (x >>> 28)) * 0x8EBC6AF09C88C6E3L;
        return x ^ (x >>> 31);
    }

    static long kernelGamma(long x) {
        x = (x ^ (x >>> 29)) * 0x94D049BB133111EBL;
        x = (x ^ (x >>> 34)) * 0x9E3779B97F4A7C15L;
        x = (x ^ (x >>> 26)) * 0xBF58476D1CE4E5B9L;
        x = (x ^ (x >>> 29)) * 0x8EBC6AF09C88C6E3L;
        x = (x ^ (x >>> 34)) * 0xA0761D6478BD642FL;
        x = (x ^ (x >>> 26)) * 0xD6E8FEB86659FD93L;
        x = (x ^ (x >>> 29)) * 0xE7037ED1A0B428DBL;
        x = (x ^ (x >>> 34)) * 0x589965CC75374CC3L;
        return x ^ (x >>> 30);
    }

    /** The caller C2 inlines the kernels into: one kernel, called in a loop until the deadline. */
    static long drive(int which, long deadline, long x) {
        do {
            for (int i = 0; i < 1024; i++) {
                switch (which) {
                    case 0: x = kernelAlpha(x); break;
                    case 1: x = kernelBeta(x); break;
                    default: x = kernelGamma(x); break;
                }
            }
        } while (System.nanoTime() < deadline);
        return x;
    }

    static void schedule(int[] weights, long sliceNanos) {
        int total = 0;
        for (int w : weights) total += w;
        long x = Thread.currentThread().getId() * 0x9E3779B97F4A7C15L + 1;
        java.util.SplittableRandom random = new java.util.SplittableRandom(x);
        while (running) {
            // random round length and first kernel: a periodic schedule aliases with a sampling profiler
            long round = sliceNanos / 2 + (long) (random.nextDouble() * sliceNanos);
            int first = random.nextInt(weights.length);
            for (int i = 0; i < weights.length; i++) {
                int m = (first + i) % weights.length;
                if (weights[m] <= 0) continue;
                long before = BEAN.getCurrentThreadCpuTime();
                x = drive(m, System.nanoTime() + round * weights[m] / total, x);
                cpuNanos.addAndGet(m, BEAN.getCurrentThreadCpuTime() - before);
                calls.incrementAndGet(m);
            }
            sink = x;
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

    public static void main(String[] args) throws Exception {
        String weightSpec = "alpha=50,beta=30,gamma=20";
        int threads = 2;
        long sliceNanos = 4_000_000L;
        long warmupMs = 3000;
        for (int i = 0; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--weights": weightSpec = args[i + 1]; break;
                case "--threads": threads = Integer.parseInt(args[i + 1]); break;
                case "--slice-ms": sliceNanos = Long.parseLong(args[i + 1]) * 1_000_000L; break;
                case "--warmup-ms": warmupMs = Long.parseLong(args[i + 1]); break;
                default: throw new IllegalArgumentException("unknown option " + args[i]);
            }
        }
        final int[] weights = new int[NAMES.length];
        for (String part : weightSpec.split(",")) {
            String[] kv = part.trim().split("=");
            int index = java.util.Arrays.asList(NAMES).indexOf(kv[0].trim());
            if (index < 0 || kv.length != 2) throw new IllegalArgumentException("bad weight '" + part + "'");
            weights[index] = Integer.parseInt(kv[1].trim());
        }
        final long slice = sliceNanos;
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            Thread worker = new Thread(() -> schedule(weights, slice), "kernel-" + t);
            worker.setDaemon(true);
            worker.start();
            workers.add(worker);
        }
        Thread.sleep(warmupMs);
        for (int m = 0; m < NAMES.length; m++) {
            cpuNanos.set(m, 0);
            calls.set(m, 0);
        }
        resetAtNanos = System.nanoTime();
        System.out.println("READY " + ProcessHandle.current().pid());
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String command = line.trim();
            if (command.equals("reset")) {
                for (int m = 0; m < NAMES.length; m++) {
                    cpuNanos.set(m, 0);
                    calls.set(m, 0);
                }
                resetAtNanos = System.nanoTime();
                System.out.println("RESET");
            } else if (command.equals("report")) {
                System.out.println(report());
            } else if (command.equals("quit")) {
                break;
            }
            System.out.flush();
        }
        running = false;
        for (Thread worker : workers) worker.join(2000);
        System.out.println(report());
        System.out.flush();
    }
}

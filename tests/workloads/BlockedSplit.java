package com.example;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteBuffer;
import java.nio.channels.Pipe;
import java.util.concurrent.locks.LockSupport;

/**
 * Off-CPU test workload with a known split of blocked time: three threads each block one way, in a
 * loop, and measure every blocking call with System.nanoTime(). That measurement is the truth a
 * profiler's off-CPU time is checked against.
 *
 *   offcpu-sleeper  Thread.sleep(SLEEP_MS)                                    -> sleep
 *   offcpu-locker   enters a monitor that offcpu-holder holds while it spins  -> lock
 *   offcpu-piper    a blocking read of a pipe that offcpu-writer feeds slowly -> net (pipe/socket wait)
 *   offcpu-parker   LockSupport.parkNanos(PARK_MS), never unparked            -> park
 *   offcpu-waiter   Object.wait(WAIT_MS) on a monitor nobody notifies         -> wait
 *   offcpu-dozer    one Thread.sleep of an hour: no context switch in a window -> sleep, all window
 *   offcpu-idler    Object.wait() without timeout, never notified              -> wait, all window
 *   two threads named as Spark names its task threads (a per-unit name: the profiler keeps the full name
 *   as the thread's context), "Executor task launch worker for task 0.0 in stage 3.0 (TID 7)" sleeping
 *   SLEEP_MS at a time and "... task 1.0 in stage 4.0 (TID 8)" parking PARK_MS at a time -> sleep, park
 * offcpu-holder spins on the CPU in burnHolding while it holds the monitor; offcpu-locker spins in
 * burnBetween until the holder takes the monitor again (holding_s, between_s: their thread CPU time).
 *
 * Protocol (stdout, one line each): READY once every thread runs, then on stdin:
 *   reset  -> zero the counters, answer RESET
 *   report -> one JSON line {"sleep_s": s, "lock_s": s, "pipe_s": s, "park_s": s, "wait_s": s,
 *             "holding_s": s, "between_s": s, "stage3_s": s, "stage4_s": s}
 *   quit   -> exit
 */
public final class BlockedSplit {
    static final Object MONITOR = new Object();
    static final Object WAITED = new Object();
    static volatile long sleepNanos, lockNanos, pipeNanos, parkNanos, waitNanos, holdingNanos, betweenNanos;
    static volatile long stage3Nanos, stage4Nanos;
    static volatile long round, lockerRound;
    static volatile long sink;
    static volatile boolean running = true;
    static final ThreadMXBean BEAN = ManagementFactory.getThreadMXBean();

    static int arg(String[] args, String name, int fallback) {
        for (int i = 0; i + 1 < args.length; i++) {
            if (args[i].equals(name)) {
                return Integer.parseInt(args[i + 1]);
            }
        }
        return fallback;
    }

    static long spinUntil(long deadline) {
        long x = 0;
        while (System.nanoTime() < deadline) {
            for (int i = 0; i < 1000; i++) {
                x = x * 6364136223846793005L + 1442695040888963407L;
            }
        }
        return x;
    }

    static long burnHolding(long nanos) {
        return spinUntil(System.nanoTime() + nanos);
    }

    static long burnBetween() {
        long x = 0;
        while (running && round == lockerRound) {  // until the holder takes the monitor again
            x += spinUntil(System.nanoTime() + 100_000);
        }
        return x;
    }

    static void sleeper(int sleepMs, boolean stageTask) {
        while (running) {
            long t0 = System.nanoTime();
            try {
                Thread.sleep(sleepMs);
            } catch (InterruptedException e) {
                return;
            }
            if (stageTask) {
                stage3Nanos += System.nanoTime() - t0;
            } else {
                sleepNanos += System.nanoTime() - t0;
            }
        }
    }

    static void holder(int holdMs) {
        while (running) {
            synchronized (MONITOR) {
                round++;
                long t0 = BEAN.getCurrentThreadCpuTime();
                sink += burnHolding(holdMs * 1_000_000L);
                holdingNanos += BEAN.getCurrentThreadCpuTime() - t0;
            }
            long taken = round;
            while (running && lockerRound != taken) {
                Thread.onSpinWait();  // the locker's turn: the monitor is not fair
            }
        }
    }

    static void locker() {
        while (running) {
            long t0 = BEAN.getCurrentThreadCpuTime();
            sink += burnBetween();
            betweenNanos += BEAN.getCurrentThreadCpuTime() - t0;
            long t1 = System.nanoTime();
            synchronized (MONITOR) {
                lockNanos += System.nanoTime() - t1;
                lockerRound = round;
            }
        }
    }

    static void writer(Pipe.SinkChannel sink, int pipeMs) {
        ByteBuffer one = ByteBuffer.allocate(1);
        try {
            while (running) {
                Thread.sleep(pipeMs);
                one.clear();
                sink.write(one);
            }
        } catch (Exception e) {
            // the pipe closed: the run is over
        }
    }

    static void piper(Pipe.SourceChannel source) {
        ByteBuffer one = ByteBuffer.allocate(1);
        try {
            while (running) {
                one.clear();
                long t0 = System.nanoTime();
                int n = source.read(one);
                pipeNanos += System.nanoTime() - t0;
                if (n < 0) {
                    return;
                }
            }
        } catch (Exception e) {
            // the pipe closed: the run is over
        }
    }

    static void parker(int parkMs, boolean stageTask) {
        while (running) {
            long t0 = System.nanoTime();
            LockSupport.parkNanos(parkMs * 1_000_000L);
            if (stageTask) {
                stage4Nanos += System.nanoTime() - t0;
            } else {
                parkNanos += System.nanoTime() - t0;
            }
        }
    }

    static void waiter(int waitMs) {
        synchronized (WAITED) {
            while (running) {
                long t0 = System.nanoTime();
                try {
                    WAITED.wait(waitMs);
                } catch (InterruptedException e) {
                    return;
                }
                waitNanos += System.nanoTime() - t0;
            }
        }
    }

    static void dozer() {
        try {
            Thread.sleep(3_600_000L);
        } catch (InterruptedException e) {
            // the run is over
        }
    }

    static final Object NEVER = new Object();

    static void idler() {
        synchronized (NEVER) {
            try {
                NEVER.wait();
            } catch (InterruptedException e) {
                // the run is over
            }
        }
    }

    static Thread start(String name, Runnable body) {
        Thread thread = new Thread(body, name);
        thread.setDaemon(true);
        thread.start();
        return thread;
    }

    static void reset() {
        sleepNanos = lockNanos = pipeNanos = parkNanos = waitNanos = holdingNanos = betweenNanos = 0;
        stage3Nanos = stage4Nanos = 0;
    }

    static String report() {
        return String.format(
            "{\"sleep_s\": %.6f, \"lock_s\": %.6f, \"pipe_s\": %.6f, \"park_s\": %.6f, \"wait_s\": %.6f, "
                + "\"holding_s\": %.6f, \"between_s\": %.6f, \"stage3_s\": %.6f, \"stage4_s\": %.6f}",
            sleepNanos / 1e9, lockNanos / 1e9, pipeNanos / 1e9, parkNanos / 1e9, waitNanos / 1e9,
            holdingNanos / 1e9, betweenNanos / 1e9, stage3Nanos / 1e9, stage4Nanos / 1e9);
    }

    public static void main(String[] args) throws Exception {
        int sleepMs = arg(args, "--sleep-ms", 20);
        int holdMs = arg(args, "--hold-ms", 30);
        int pipeMs = arg(args, "--pipe-ms", 25);
        int parkMs = arg(args, "--park-ms", 15);
        int waitMs = arg(args, "--wait-ms", 35);
        Pipe pipe = Pipe.open();
        start("offcpu-sleeper", () -> sleeper(sleepMs, false));
        start("offcpu-holder", () -> holder(holdMs));
        start("offcpu-locker", BlockedSplit::locker);
        start("offcpu-writer", () -> writer(pipe.sink(), pipeMs));
        start("offcpu-piper", () -> piper(pipe.source()));
        start("offcpu-parker", () -> parker(parkMs, false));
        start("offcpu-waiter", () -> waiter(waitMs));
        start("offcpu-dozer", BlockedSplit::dozer);
        start("offcpu-idler", BlockedSplit::idler);
        start("Executor task launch worker for task 0.0 in stage 3.0 (TID 7)", () -> sleeper(sleepMs, true));
        start("Executor task launch worker for task 1.0 in stage 4.0 (TID 8)", () -> parker(parkMs, true));
        System.out.println("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            line = line.trim();
            if (line.equals("reset")) {
                reset();
                System.out.println("RESET");
            } else if (line.equals("report")) {
                System.out.println(report());
            } else if (line.equals("quit")) {
                break;
            }
        }
        running = false;
        pipe.sink().close();
        System.exit(0);
    }
}

package com.example;

import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

/**
 * Off-CPU test workload whose waits are told apart only by the Java methods that wait: every worker thread
 * (all named "waitsplit-worker-N", so the thread name tells nothing) does in turn, each inside its own
 * method, a sleep (waitSleeping), a wait for a monitor its holder thread holds (waitMonitor), a blocking
 * read of a loopback socket whose peer answers late (waitSocket) and a LockSupport.parkNanos
 * (waitParked), and measures each wait with System.nanoTime(): the truth a profiler's off-CPU time by
 * method is checked against. Run without -XX:+PreserveFramePointer and without any perf map or agent.
 *
 * Protocol (stdout, one line each): READY once every thread runs, then on stdin:
 *   reset  -> zero the counters, answer RESET
 *   report -> one JSON line {"sleeping_s": s, "monitor_s": s, "socket_s": s, "parked_s": s}
 *   quit   -> exit
 */
public final class WaitSplit {
    static final int WORKERS = 2;
    // different lengths, so that a method's share differs from the others' (sums ~40 % / 15 % / 25 % / 20 %)
    static final long SLEEP_MS = 24, HOLD_MS = 9, REPLY_MS = 15, PARK_MS = 12;
    static final AtomicLong sleepingNanos = new AtomicLong(), monitorNanos = new AtomicLong();
    static final AtomicLong socketNanos = new AtomicLong(), parkedNanos = new AtomicLong();
    static volatile boolean running = true;
    static volatile long sink;

    static final class Worker extends Thread {
        final Object lock = new Object();
        volatile boolean held;
        final Thread holder;
        final Socket socket;
        final InputStream in;
        final OutputStream out;

        Worker(int index, Socket socket) throws Exception {
            super("waitsplit-worker-" + index);
            setDaemon(true);
            this.socket = socket;
            this.in = socket.getInputStream();
            this.out = socket.getOutputStream();
            this.holder = new Thread(this::hold, "waitsplit-holder-" + index);
            this.holder.setDaemon(true);
        }

        // Takes the worker's monitor each time the worker unparks it, and holds it HOLD_MS off the CPU.
        void hold() {
            while (running) {
                LockSupport.park();
                synchronized (lock) {
                    held = true;
                    try {
                        Thread.sleep(HOLD_MS);
                    } catch (InterruptedException e) {
                        return;
                    }
                    held = false;
                }
            }
        }

        long waitSleeping() throws InterruptedException {
            long t0 = System.nanoTime();
            Thread.sleep(SLEEP_MS);
            return System.nanoTime() - t0;
        }

        long waitMonitor() {
            LockSupport.unpark(holder);
            while (!held && running) {
                Thread.onSpinWait();  // until the holder has the monitor (on the CPU, not timed)
            }
            long t0 = System.nanoTime();
            synchronized (lock) {
                sink += 1;
            }
            return System.nanoTime() - t0;
        }

        long waitSocket() throws Exception {
            out.write(1);
            out.flush();
            long t0 = System.nanoTime();
            if (in.read() < 0) {
                throw new IllegalStateException("peer closed");
            }
            return System.nanoTime() - t0;
        }

        long waitParked() {
            long t0 = System.nanoTime();
            LockSupport.parkNanos(PARK_MS * 1_000_000L);
            return System.nanoTime() - t0;
        }

        @Override
        public void run() {
            try {
                while (running) {
                    sleepingNanos.addAndGet(waitSleeping());
                    monitorNanos.addAndGet(waitMonitor());
                    socketNanos.addAndGet(waitSocket());
                    parkedNanos.addAndGet(waitParked());
                }
            } catch (Exception e) {
                e.printStackTrace();
            }
        }
    }

    // The socket's peer: answers each byte REPLY_MS later.
    static void answer(Socket peer) {
        try (Socket socket = peer) {
            InputStream in = socket.getInputStream();
            OutputStream out = socket.getOutputStream();
            while (running && in.read() >= 0) {
                Thread.sleep(REPLY_MS);
                out.write(2);
                out.flush();
            }
        } catch (Exception e) {
            if (running) {
                e.printStackTrace();
            }
        }
    }

    public static void main(String[] args) throws Exception {
        ServerSocket server = new ServerSocket(0, 16, InetAddress.getLoopbackAddress());
        Worker[] workers = new Worker[WORKERS];
        for (int i = 0; i < WORKERS; i++) {
            Socket client = new Socket(InetAddress.getLoopbackAddress(), server.getLocalPort());
            client.setTcpNoDelay(true);
            Socket peer = server.accept();
            peer.setTcpNoDelay(true);
            Thread answering = new Thread(() -> answer(peer), "waitsplit-peer-" + i);
            answering.setDaemon(true);
            answering.start();
            workers[i] = new Worker(i, client);
            workers[i].holder.start();
            workers[i].start();
        }
        java.io.BufferedReader commands = new java.io.BufferedReader(new java.io.InputStreamReader(System.in));
        System.out.println("READY");
        System.out.flush();
        String line;
        while ((line = commands.readLine()) != null) {
            if (line.equals("reset")) {
                sleepingNanos.set(0);
                monitorNanos.set(0);
                socketNanos.set(0);
                parkedNanos.set(0);
                System.out.println("RESET");
            } else if (line.equals("report")) {
                System.out.println(String.format(
                    "{\"sleeping_s\": %.6f, \"monitor_s\": %.6f, \"socket_s\": %.6f, \"parked_s\": %.6f}",
                    sleepingNanos.get() / 1e9, monitorNanos.get() / 1e9, socketNanos.get() / 1e9, parkedNanos.get() / 1e9));
            } else if (line.equals("quit")) {
                break;
            }
            System.out.flush();
        }
        running = false;
    }
}

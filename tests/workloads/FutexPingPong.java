package com.example;

import java.util.concurrent.locks.LockSupport;

/**
 * Two threads hand a token back and forth with LockSupport.park/unpark, so their CPU goes to glibc's
 * futex wait and wake paths (pthread_cond_signal, __futex_abstimed_wait_common), which have no frame
 * pointers, and to the kernel below them. A whole stack reaches the thread's start (clone3).
 *
 * Prints READY once both threads run; exits after the given seconds (default 30) or at end of stdin.
 */
public final class FutexPingPong {
    static volatile int turn;
    static volatile boolean running = true;
    static volatile Thread ping, pong;

    static void play(int me) {
        while (running) {
            while (turn != me && running) {
                LockSupport.park();
            }
            turn = 1 - me;
            LockSupport.unpark(me == 0 ? pong : ping);
        }
    }

    public static void main(String[] args) throws Exception {
        long seconds = args.length > 0 ? Long.parseLong(args[0]) : 30;
        ping = new Thread(() -> play(0), "ping");
        pong = new Thread(() -> play(1), "pong");
        ping.start();
        pong.start();
        System.out.println("READY");
        System.out.flush();
        Thread waiter = new Thread(() -> {
            try {
                while (System.in.read() >= 0) { }
            } catch (Exception ignored) { }
            running = false;
        });
        waiter.setDaemon(true);
        waiter.start();
        long deadline = System.nanoTime() + seconds * 1_000_000_000L;
        while (running && System.nanoTime() < deadline) {
            Thread.sleep(50);
        }
        running = false;
        LockSupport.unpark(ping);
        LockSupport.unpark(pong);
        ping.join();
        pong.join();
    }
}

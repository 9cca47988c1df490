package com.example;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.locks.LockSupport;

/**
 * Context-switch-heavy workload for bench/bench_offcpu.py: pairs of threads hand a token back and forth
 * with LockSupport.park/unpark, so every hand-off is two context switches (tens of thousands a second).
 *
 * Options: --pairs N (2); --work N (0): rounds of a xorshift each player computes before each hand-off, so
 * that the pairs do some CPU work per context switch as real pipelines do (0: nothing but hand-offs).
 * Protocol: READY once running; on stdin "count" answers the hand-offs so far
 * (one number per line); "quit" (or end of stdin) exits.
 */
public final class PingPongRate {
    static volatile boolean running = true;
    static int work;

    static final class Pair {
        volatile int turn;
        volatile long handoffs;
        long result; // the work's result, kept so that the loop is not removed
        volatile Thread[] players = new Thread[2];

        void play(int me) {
            long x = 88172645463325252L + me;
            while (running) {
                while (turn != me && running) {
                    LockSupport.park();
                }
                for (int i = 0; i < work; i++) {
                    x ^= x << 13;
                    x ^= x >>> 7;
                    x ^= x << 17;
                }
                result = x;
                turn = 1 - me;
                handoffs++;
                LockSupport.unpark(players[1 - me]);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        int pairs = 2;
        for (int a = 0; a + 1 < args.length; a += 2) {
            if (args[a].equals("--pairs")) {
                pairs = Integer.parseInt(args[a + 1]);
            } else if (args[a].equals("--work")) {
                work = Integer.parseInt(args[a + 1]);
            }
        }
        Pair[] all = new Pair[pairs];
        for (int p = 0; p < pairs; p++) {
            Pair pair = all[p] = new Pair();
            for (int me = 0; me < 2; me++) {
                final int side = me;
                pair.players[me] = new Thread(() -> pair.play(side), "pingpong-" + p + "-" + me);
                pair.players[me].setDaemon(true);
            }
            pair.players[0].start();
            pair.players[1].start();
        }
        System.out.println("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.trim().equals("count")) {
                long total = 0;
                for (Pair pair : all) {
                    total += pair.handoffs;
                }
                System.out.println(total);
            } else if (line.trim().equals("quit")) {
                break;
            }
        }
        running = false;
        System.exit(0);
    }
}

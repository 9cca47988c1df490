package com.example;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.lang.reflect.Method;

/**
 * Class-unloading workload: a worker thread loads ChurnA (then ChurnB, then ChurnA ...) afresh in a new class
 * loader, spins in its methods for a while (interpreted under -Xint), drops the loader and runs a full GC, so
 * the class is unloaded and its Method* freed while a profiler samples it. HotSpot reuses the freed
 * metaspace for the next class, so the same Method* address names ChurnA's and ChurnB's methods in turn:
 * a profiler that names a Method* once would give one class the other's samples.
 *
 * Protocol (stdout): READY once the first class ran; on stdin "report" answers {"loads": n, "unloaded": n}
 * (classes unloaded per the JVM's class-loading bean), "quit" exits.
 */
public final class Unloader {
    static volatile boolean running = true;
    static volatile long loads;

    /** Defines the Churn classes itself instead of asking its parent, so each instance holds its own copy. */
    static final class ChurnLoader extends ClassLoader {
        ChurnLoader() {
            super(Unloader.class.getClassLoader());
        }

        @Override
        protected Class<?> loadClass(String name, boolean resolve) throws ClassNotFoundException {
            if (!name.startsWith("com.example.Churn")) {
                return super.loadClass(name, resolve);
            }
            String file = name.replace('.', '/') + ".class";
            try (InputStream in = getParent().getResourceAsStream(file)) {
                byte[] bytes = in.readAllBytes();
                return defineClass(name, bytes, 0, bytes.length);
            } catch (IOException e) {
                throw new ClassNotFoundException(name, e);
            }
        }
    }

    static void churnOnce(String className, long spinMillis) throws Exception {
        Class<?> churn = new ChurnLoader().loadClass(className);
        Method spin = churn.getMethod("spin", long.class);
        spin.setAccessible(true);  // Churn is package-private, and another loader makes another package
        spin.invoke(null, spinMillis);
        loads++;
    }

    public static void main(String[] args) throws Exception {
        long spinMillis = args.length > 0 ? Long.parseLong(args[0]) : 200;
        churnOnce("com.example.ChurnA", 10);
        Thread worker = new Thread(() -> {
            try {
                while (running) {
                    churnOnce(loads % 2 == 0 ? "com.example.ChurnA" : "com.example.ChurnB", spinMillis);
                    System.gc();  // the loader is unreachable: a full GC unloads its Churn
                }
            } catch (Exception e) {
                e.printStackTrace();
            }
        }, "churner");
        worker.setDaemon(true);
        worker.start();
        System.out.println("READY " + ProcessHandle.current().pid());
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.equals("report")) {
                long unloaded = java.lang.management.ManagementFactory.getClassLoadingMXBean().getUnloadedClassCount();
                System.out.println("{\"loads\": " + loads + ", \"unloaded\": " + unloaded + "}");
                System.out.flush();
            } else if (line.equals("quit")) {
                break;
            }
        }
        running = false;
    }
}

/** Loaded afresh by each ChurnLoader; spinLoop is where the samples land. */
final class ChurnA {
    static volatile long sink;

    public static void spin(long millis) {
        long deadline = System.nanoTime() + millis * 1_000_000L;
        while (System.nanoTime() < deadline) {
            sink += spinLoop(sink);
        }
    }

    static long spinLoop(long seed) {
        long x = seed | 1;
        for (int i = 0; i < 500; i++) {
            x ^= x << 13; x ^= x >>> 7; x ^= x << 17;
        }
        return x;
    }
}

/** ChurnA under another name: the two alternate in the same freed memory. */
final class ChurnB {
    static volatile long sink;

    public static void spin(long millis) {
        long deadline = System.nanoTime() + millis * 1_000_000L;
        while (System.nanoTime() < deadline) {
            sink += spinLoop(sink);
        }
    }

    static long spinLoop(long seed) {
        long x = seed | 1;
        for (int i = 0; i < 500; i++) {
            x ^= x << 13; x ^= x >>> 7; x ^= x << 17;
        }
        return x;
    }
}

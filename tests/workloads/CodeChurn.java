package com.example;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.SplittableRandom;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * A JVM whose compiled code keeps changing, with a known CPU split: code-cache churn for the
 * perf-map refresh tests. Every generation (--generation-ms) defines fresh copies of the template
 * classes com.example.churn.ChurnAlpha and ChurnBeta from --templates (a directory NOT on the class
 * path) in a new class loader, burns CPU in their burn() methods in a random alternation weighted
 * --weights (JIT-compiles them anew), then drops the loader and runs a full GC so the classes unload
 * and their compiled code is freed: the next generation's code lands at reused addresses.
 * Thread CPU per template is measured with ThreadMXBean: the truth.
 *
 * Protocol as CpuSplit: READY once the first generations ran; stdin reset | report | quit.
 * report: {"cpu_seconds": {"ChurnAlpha": s, "ChurnBeta": s}, "generations": n, "unloaded": n}
 */
public final class CodeChurn {
    static final String[] NAMES = {"ChurnAlpha", "ChurnBeta"};
    static final AtomicLongArray cpuNanos = new AtomicLongArray(NAMES.length);
    static volatile long generations;
    static volatile long sink;
    static final ThreadMXBean BEAN = ManagementFactory.getThreadMXBean();

    static final class GenerationLoader extends ClassLoader {
        private final Path templates;

        GenerationLoader(Path templates) {
            super(CodeChurn.class.getClassLoader());
            this.templates = templates;
        }

        @Override
        protected Class<?> findClass(String name) throws ClassNotFoundException {
            try {
                byte[] bytes = Files.readAllBytes(templates.resolve(name.replace('.', '/') + ".class"));
                return defineClass(name, bytes, 0, bytes.length);
            } catch (java.io.IOException e) {
                throw new ClassNotFoundException(name, e);
            }
        }
    }

    static void generation(Path templates, int[] weights, long lengthNanos, SplittableRandom random) throws Throwable {
        GenerationLoader loader = new GenerationLoader(templates);
        MethodHandle[] burners = new MethodHandle[NAMES.length];
        MethodType type = MethodType.methodType(long.class, long.class, long.class);
        for (int m = 0; m < NAMES.length; m++) {
            Class<?> copy = loader.loadClass("com.example.churn." + NAMES[m]);
            burners[m] = MethodHandles.publicLookup().findStatic(copy, "burn", type);
        }
        int total = 0;
        for (int w : weights) total += w;
        long end = System.nanoTime() + lengthNanos;
        long seed = random.nextLong();
        while (System.nanoTime() < end) {
            int m = random.nextInt(total) < weights[0] ? 0 : 1;
            long slice = 1_000_000L + (long) (random.nextDouble() * 3_000_000L);
            long before = BEAN.getCurrentThreadCpuTime();
            seed = (long) burners[m].invokeExact(System.nanoTime() + slice, seed);
            cpuNanos.addAndGet(m, BEAN.getCurrentThreadCpuTime() - before);
        }
        sink = seed;
        generations++;
    }

    static String report() {
        long unloaded = ManagementFactory.getClassLoadingMXBean().getUnloadedClassCount();
        return "{\"cpu_seconds\": {\"" + NAMES[0] + "\": " + cpuNanos.get(0) / 1e9 + ", \"" + NAMES[1] + "\": "
            + cpuNanos.get(1) / 1e9 + "}, \"generations\": " + generations + ", \"unloaded\": " + unloaded
            + ", \"pid\": " + ProcessHandle.current().pid() + "}";
    }

    public static void main(String[] args) throws Exception {
        Path templates = Path.of(args[0]);
        long generationNanos = Long.parseLong(args.length > 1 ? args[1] : "3000") * 1_000_000L;
        int alpha = Integer.parseInt(args.length > 2 ? args[2] : "60");
        int[] weights = {alpha, 100 - alpha};
        Thread worker = new Thread(() -> {
            SplittableRandom random = new SplittableRandom(42);
            try {
                while (true) {
                    generation(templates, weights, generationNanos, random);
                    System.gc();  // unloads the previous generation: its code is freed
                }
            } catch (Throwable e) {
                e.printStackTrace();
                System.exit(3);
            }
        }, "churner");
        worker.setDaemon(true);
        worker.start();
        while (generations < 2) Thread.sleep(50);
        System.out.println("READY " + ProcessHandle.current().pid());
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null; ) {
            switch (line.trim()) {
                case "reset":
                    for (int m = 0; m < NAMES.length; m++) cpuNanos.set(m, 0);
                    System.out.println("RESET");
                    break;
                case "report":
                    System.out.println(report());
                    break;
                case "quit":
                    System.out.println(report());
                    System.exit(0);
                    break;
                default:
                    System.out.println("ERROR unknown command " + line);
            }
            System.out.flush();
        }
    }
}

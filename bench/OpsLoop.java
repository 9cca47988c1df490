import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.HashMap;
import java.util.concurrent.atomic.LongAdder;

/**
 * CPU-bound throughput workload for the overhead benchmark: worker threads repeat a fixed unit of
 * work (hash-map updates, string building, arithmetic) and count completed units.
 * Options: --threads N (2). Protocol: prints READY after a JIT warm-up; on stdin "mark" answers
 * "MARK <units> <nanoTime>" (cumulative), "quit" exits.
 */
public final class OpsLoop {
    static final LongAdder UNITS = new LongAdder();
    static volatile long sink;

    static long unit(long seed) {
        HashMap<Integer, Long> counts = new HashMap<>(64);
        StringBuilder text = new StringBuilder(64);
        long x = seed;
        for (int i = 0; i < 256; i++) {
            x ^= x << 13; x ^= x >>> 7; x ^= x << 17;
            counts.merge((int) (x & 63), x, Long::sum);
            if ((i & 31) == 0) {
                text.setLength(0);
                text.append(x).append(':').append(i);
                x += text.toString().hashCode();
            }
        }
        for (Long v : counts.values()) x += v;
        return x;
    }

    public static void main(String[] args) throws Exception {
        int threads = 2;
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (args[i].equals("--threads")) threads = Integer.parseInt(args[i + 1]);
            else throw new IllegalArgumentException("unknown option " + args[i]);
        }
        for (int t = 0; t < threads; t++) {
            final long seed0 = 0x9E3779B97F4A7C15L * (t + 1);
            Thread worker = new Thread(() -> {
                long seed = seed0;
                while (true) {
                    seed = unit(seed) | 1;
                    UNITS.increment();
                    sink = seed;
                }
            }, "ops-" + t);
            worker.setDaemon(true);
            worker.start();
        }
        Thread.sleep(3000);
        System.out.println("READY " + ProcessHandle.current().pid());
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String command = line.trim();
            if (command.equals("mark")) {
                System.out.println("MARK " + UNITS.sum() + " " + System.nanoTime());
            } else if (command.equals("quit")) {
                break;
            }
            System.out.flush();
        }
    }
}

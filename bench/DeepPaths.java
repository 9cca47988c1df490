import java.util.concurrent.ThreadLocalRandom;

/**
 * Deep stacks, each line's own (bench/postrun_memory.py's target, no Spark): threads make lines of random
 * words and map each through bench/DeepStream.java's recursion, 100-250 calls deep along a path the line's
 * hash chooses among four methods, so about every sample is a distinct stack.
 * Usage: java -XX:+PreserveFramePointer DeepPaths.java [THREADS]
 */
public final class DeepPaths {
    private static final String[] WORDS = {"spark", "flink", "stream", "window", "task", "stage", "shuffle",
        "executor", "record", "batch", "state", "watermark", "join", "hash", "count", "sink"};

    private DeepPaths() {
    }

    static long step(long path) {
        return path * 6364136223846793005L + 1442695040888963407L;
    }

    static long descend(String line, int depth, long path) {
        if (depth <= 0) {
            long hash = 0;
            for (String word : line.split(" ")) {
                hash = hash * 31 + word.hashCode();
            }
            for (int i = 0; i < 1_000_000; i++) {
                hash ^= (hash << 7) ^ (hash >>> 3) + i;
            }
            return hash;
        }
        long next = step(path);
        switch ((int) (next >>> 62)) {
            case 0:
                return viaParse(line, depth - 1, next) ^ 1;
            case 1:
                return viaMerge(line, depth - 1, next) + 3;
            case 2:
                return viaSplit(line, depth - 1, next) * 5;
            default:
                return descend(line, depth - 1, next) * 7;
        }
    }

    static long viaParse(String line, int depth, long path) {
        return descend(line, depth, path) + line.length();
    }

    static long viaMerge(String line, int depth, long path) {
        return descend(line, depth, path) - depth;
    }

    static long viaSplit(String line, int depth, long path) {
        return descend(line, depth, path) ^ path;
    }

    static void loop() {
        ThreadLocalRandom random = ThreadLocalRandom.current();
        long sink = 0;
        while (true) {
            StringBuilder line = new StringBuilder();
            for (int i = 0; i < 20; i++) {
                line.append(WORDS[random.nextInt(WORDS.length)]).append(' ');
            }
            String text = line.toString();
            sink += descend(text, 100 + Math.floorMod(text.hashCode(), 150), text.hashCode());
            if (sink == 42) {
                System.out.println(sink);
            }
        }
    }

    public static void main(String[] args) throws InterruptedException {
        int threads = args.length > 0 ? Integer.parseInt(args[0]) : 1;
        for (int i = 0; i < threads; i++) {
            Thread thread = new Thread(DeepPaths::loop, "deep-" + i);
            thread.start();
        }
        Thread.currentThread().join();
    }
}

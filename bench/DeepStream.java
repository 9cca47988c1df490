import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.streaming.Trigger;

/**
 * A Spark Structured Streaming job with deep Java stacks (issue 29's benchmark workload): lines from a
 * socket, each mapped by a recursion 100-250 calls deep (three mutually recursive methods, so the JIT
 * cannot fold it into one frame) before it hashes its words; counts per hash bucket every 5 s.
 * Usage: spark-submit deepstream.jar HOST PORT
 */
public final class DeepStream {
    private DeepStream() {
    }

    static long descend(String line, int depth) {
        if (depth <= 0) {
            long hash = 0;
            for (String word : line.split(" ")) {
                hash = hash * 31 + word.hashCode();
            }
            for (int i = 0; i < 400; i++) {
                hash ^= (hash << 7) ^ (hash >>> 3) + i;
            }
            return hash;
        }
        switch (depth % 3) {
            case 0:
                return viaParse(line, depth - 1) ^ 1;
            case 1:
                return viaMerge(line, depth - 1) + 3;
            default:
                return descend(line, depth - 1) * 7;
        }
    }

    static long viaParse(String line, int depth) {
        return descend(line, depth) + line.length();
    }

    static long viaMerge(String line, int depth) {
        return descend(line, depth) - depth;
    }

    public static void main(String[] args) throws Exception {
        SparkSession spark = SparkSession.builder().appName("DeepStream").getOrCreate();
        Dataset<String> lines = spark.readStream().format("socket").option("host", args[0])
                .option("port", Integer.parseInt(args[1])).load().as(Encoders.STRING());
        Dataset<Long> hashes = lines.map(
                (MapFunction<String, Long>) line -> descend(line, 100 + Math.floorMod(line.hashCode(), 150)),
                Encoders.LONG());
        StreamingQuery query = hashes.groupBy(hashes.col("value").mod(16)).count().writeStream()
                .outputMode("complete").format("console").option("numRows", 2)
                .trigger(Trigger.ProcessingTime("5 seconds")).start();
        query.awaitTermination();
    }
}

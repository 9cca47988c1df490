import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.streaming.Trigger;

/**
 * A Spark Structured Streaming job with deep Java stacks (issue 29's benchmark workload): lines from a
 * socket, each mapped by bench/DeepPaths.java's recursion 100-250 calls deep before it hashes its words
 * (about 1 ms of work); counts per hash bucket every 5 s. Four mutually recursive methods (the JIT cannot
 * fold them into one frame), and which one each level calls follows the line's own path (an LCG seeded by
 * its hash): every line has its own call chain, so a window holds about as many distinct stacks as samples
 * (issue 29's executor had 22,293).
 * Usage: spark-submit deepstream.jar HOST PORT
 */
public final class DeepStream {
    private DeepStream() {
    }

    public static void main(String[] args) throws Exception {
        SparkSession spark = SparkSession.builder().appName("DeepStream").getOrCreate();
        Dataset<String> lines = spark.readStream().format("socket").option("host", args[0])
                .option("port", Integer.parseInt(args[1])).load().as(Encoders.STRING());
        Dataset<Long> hashes = lines.map(
                (MapFunction<String, Long>) line ->
                        DeepPaths.descend(line, 100 + Math.floorMod(line.hashCode(), 150), line.hashCode()),
                Encoders.LONG());
        StreamingQuery query = hashes.groupBy(hashes.col("value").mod(16)).count().writeStream()
                .outputMode("complete").format("console").option("numRows", 2)
                .trigger(Trigger.ProcessingTime("5 seconds")).start();
        query.awaitTermination();
    }
}

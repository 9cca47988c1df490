package ysb;

import java.io.IOException;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.internal.connector.SupportsStreamingUpdateAsAppend;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * YSB's Redis sink as a Spark streaming data source: each executor task writes its rows to Redis
 * itself (the original YSB writes window counts from the workers), so the sink's CPU is spent in
 * the executor JVMs where the profiler samples it. No client library: RESP over a plain socket.
 *
 * Row layout: column 0 is the window key suffix, every other column becomes a field of the window's
 * hash; columns named campaign_id and window_start_ms also index the window per campaign (see
 * RedisOutputWriter). Options: host (127.0.0.1), port (6379), prefix ("ysb:").
 */
public final class RedisSink implements TableProvider {
    /** The field of a window's hash that every write of the window sets to the wall clock (epoch ms), as YSB's. */
    static final byte[] TIME_UPDATED = utf8("time_updated");

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return new StructType();
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new RedisTable(schema);
    }

    static final class RedisTable implements Table, SupportsWrite {
        private final StructType schema;

        RedisTable(StructType schema) {
            this.schema = schema;
        }

        @Override
        public String name() {
            return "ysb-redis";
        }

        @Override
        public StructType schema() {
            return schema;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.STREAMING_WRITE);
        }

        @Override
        public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
            return new RedisWriteBuilder(info);
        }
    }

    static final class RedisWriteBuilder implements WriteBuilder, SupportsStreamingUpdateAsAppend {
        private final LogicalWriteInfo info;

        RedisWriteBuilder(LogicalWriteInfo info) {
            this.info = info;
        }

        @Override
        public Write build() {
            final StructType schema = info.schema();
            final CaseInsensitiveStringMap options = info.options();
            return new Write() {
                @Override
                public StreamingWrite toStreaming() {
                    return new RedisStreamingWrite(
                        schema,
                        options.getOrDefault("host", "127.0.0.1"),
                        Integer.parseInt(options.getOrDefault("port", "6379")),
                        options.getOrDefault("prefix", "ysb:"),
                        Long.parseLong(options.getOrDefault("windowMillis", "0")));
                }
            };
        }
    }

    static final class RedisStreamingWrite implements StreamingWrite {
        private final RedisWriterFactory factory;

        RedisStreamingWrite(StructType schema, String host, int port, String prefix, long windowMillis) {
            this.factory = new RedisWriterFactory(schema, host, port, prefix, windowMillis);
        }

        @Override
        public StreamingDataWriterFactory createStreamingWriterFactory(PhysicalWriteInfo info) {
            return factory;
        }

        @Override
        public void commit(long epochId, WriterCommitMessage[] messages) {
        }

        @Override
        public void abort(long epochId, WriterCommitMessage[] messages) {
        }
    }

    static final class RedisWriterFactory implements StreamingDataWriterFactory, Serializable {
        private static final long serialVersionUID = 1L;
        private final StructType schema;
        private final String host;
        private final int port;
        private final String prefix;
        private final long windowMillis;

        RedisWriterFactory(StructType schema, String host, int port, String prefix, long windowMillis) {
            this.schema = schema;
            this.host = host;
            this.port = port;
            this.prefix = prefix;
            this.windowMillis = windowMillis;
        }

        @Override
        public DataWriter<InternalRow> createWriter(int partitionId, long taskId, long epochId) {
            if (windowMillis > 0) {
                return new WindowCacheWriter(schema, host, port, prefix, windowMillis);
            }
            return new RedisOutputWriter(schema, host, port, prefix);
        }
    }

    static final class Written implements WriterCommitMessage {
        private static final long serialVersionUID = 1L;
        final long rows;

        Written(long rows) {
            this.rows = rows;
        }
    }

    /**
     * Writes each window row as YSB's Redis sink does, one synchronous command at a time (YSB uses a
     * plain, unpipelined Jedis connection): look the window up in the campaign's hash, register it
     * there and in the campaign's window list when new, then store the window's fields:
     *   HGET   <prefix>campaign:<campaign_id> <window_start_ms>
     *   HSET   <prefix>campaign:<campaign_id> <window_start_ms> <window key>   (new windows only)
     *   LPUSH  <prefix>windows:<campaign_id> <window_start_ms>                  (new windows only)
     *   HSET   <prefix>window:<col0> <name1> <value1> ... time_updated <now, epoch ms>
     * (time_updated: YSB's, the wall-clock time of the window's latest write; the demo's latency per
     * window is the last one minus the window's end.) Without campaign_id/window_start_ms columns only the last command is sent.
     * The class name ends in OutputWriter so that profiles which know Spark's output writers
     * attribute it to the sink.
     */
    static final class RedisOutputWriter implements DataWriter<InternalRow> {
        private final StructField[] fields;
        private final String prefix;
        private final int campaignColumn;
        private final int windowColumn;
        private final RespConnection redis;
        private long written;

        RedisOutputWriter(StructType schema, String host, int port, String prefix) {
            this.fields = schema.fields();
            this.prefix = prefix;
            this.campaignColumn = indexOf(fields, "campaign_id");
            this.windowColumn = indexOf(fields, "window_start_ms");
            this.redis = new RespConnection(host, port);
        }

        @Override
        public void write(InternalRow row) throws IOException {
            byte[] windowKey = utf8(prefix + "window:" + new String(value(fields, row, 0), StandardCharsets.UTF_8));
            if (campaignColumn > 0 && windowColumn > 0) {
                registerWindow(redis, prefix, new String(value(fields, row, campaignColumn), StandardCharsets.UTF_8),
                    value(fields, row, windowColumn), windowKey);
            }
            List<byte[]> args = new ArrayList<>(4 + 2 * fields.length);
            args.add(utf8("HSET"));
            args.add(windowKey);
            for (int i = 1; i < fields.length; i++) {
                args.add(utf8(fields[i].name()));
                args.add(value(fields, row, i));
            }
            args.add(TIME_UPDATED);
            args.add(utf8(Long.toString(System.currentTimeMillis())));
            redis.call(args);
            written++;
        }

        @Override
        public WriterCommitMessage commit() throws IOException {
            return new Written(written);
        }

        @Override
        public void abort() {
        }

        @Override
        public void close() throws IOException {
            redis.close();
        }
    }

    /**
     * The window of YSB for Spark Continuous Processing and Real-time Mode, which run no stateful
     * operator: (campaign, window start) -> count, latest event time and worst pre-window latency of
     * the rows a writer saw since its last flush, added to the window's state in Redis by flush()
     * (HINCRBY the count; the paper's Spark CP YSB keeps its window state in Redis the same way), and
     * YSB's time_updated set at each flush's write of the window (so a window's last flush sets it last).
     * Redis keys as RedisOutputWriter's, so the demo counts windows the same way for every mode. The
     * connection stays open across epochs and batches (one per task thread).
     */
    static final class WindowCache {
        private static final ThreadLocal<RespConnection> CONNECTION = new ThreadLocal<>();
        private final String prefix;
        private final long windowMillis;
        private final RespConnection redis;
        private final Map<String, long[]> windows = new HashMap<>();
        long written;

        WindowCache(String host, int port, String prefix, long windowMillis) {
            this.prefix = prefix;
            this.windowMillis = windowMillis;
            RespConnection open = CONNECTION.get();
            if (open == null || open.isClosed()) {
                open = new RespConnection(host, port);
                CONNECTION.set(open);
            }
            this.redis = open;
        }

        void add(String campaign, long eventTime, long latency) {
            long windowStart = eventTime - Math.floorMod(eventTime, windowMillis);
            long[] window = windows.computeIfAbsent(campaign + ":" + windowStart, k -> new long[3]);
            window[0]++;
            window[1] = Math.max(window[1], eventTime);
            window[2] = Math.max(window[2], latency);
            written++;
        }

        void flush() throws IOException {
            String now = Long.toString(System.currentTimeMillis());
            for (Map.Entry<String, long[]> entry : windows.entrySet()) {
                String key = entry.getKey();
                int colon = key.lastIndexOf(':');
                String campaign = key.substring(0, colon);
                byte[] windowStart = utf8(key.substring(colon + 1));
                byte[] windowKey = utf8(prefix + "window:" + key);
                long[] window = entry.getValue();
                registerWindow(redis, prefix, campaign, windowStart, windowKey);
                redis.call(List.of(utf8("HINCRBY"), windowKey, utf8("events"), utf8(Long.toString(window[0]))));
                redis.call(List.of(utf8("HSET"), windowKey, utf8("campaign_id"), utf8(campaign),
                    utf8("window_start_ms"), windowStart, utf8("last_event_time"), utf8(Long.toString(window[1])),
                    utf8("max_pre_window_latency_ms"), utf8(Long.toString(window[2])), utf8("written_at_ms"), utf8(now),
                    TIME_UPDATED, utf8(Long.toString(System.currentTimeMillis()))));
            }
            windows.clear();
        }

        void clear() {
            windows.clear();
        }
    }

    /**
     * Continuous Processing's window sink: a WindowCache per task and epoch, flushed when the epoch
     * commits. Rows: campaign_id, event_time (epoch ms), pre_window_latency_ms.
     */
    static final class WindowCacheWriter implements DataWriter<InternalRow> {
        private final WindowCache cache;

        WindowCacheWriter(StructType schema, String host, int port, String prefix, long windowMillis) {
            if (schema.fields().length < 3) {
                throw new IllegalArgumentException("ysb window sink: needs campaign_id, event_time, pre_window_latency_ms");
            }
            this.cache = new WindowCache(host, port, prefix, windowMillis);
        }

        @Override
        public void write(InternalRow row) {
            cache.add(row.getUTF8String(0).toString(), row.getLong(1), row.isNullAt(2) ? 0 : row.getLong(2));
        }

        @Override
        public WriterCommitMessage commit() throws IOException {
            cache.flush();
            return new Written(cache.written);
        }

        @Override
        public void abort() {
            cache.clear();
        }

        @Override
        public void close() {
            // The thread's connection is reused by the next epoch's writer.
        }
    }

    /**
     * Real-time Mode's window sink: RTM accepts only allowlisted sinks (Kafka, foreach, console,
     * memory), so the same WindowCache behind a ForeachWriter, flushed when the task's batch ends
     * (close without an error). Spark converts each row to a Row for it. Made on the driver with
     * windowForeachWriter(...) through py4j and handed to DataStreamWriter.foreach.
     */
    public static final class WindowCacheForeachWriter extends ForeachWriter<Row> {
        private static final long serialVersionUID = 1L;
        private final String host;
        private final int port;
        private final String prefix;
        private final long windowMillis;
        private transient WindowCache cache;

        WindowCacheForeachWriter(String host, int port, String prefix, long windowMillis) {
            this.host = host;
            this.port = port;
            this.prefix = prefix;
            this.windowMillis = windowMillis;
        }

        @Override
        public boolean open(long partitionId, long epochId) {
            cache = new WindowCache(host, port, prefix, windowMillis);
            return true;
        }

        @Override
        public void process(Row row) {
            cache.add(row.getString(0), row.getLong(1), row.isNullAt(2) ? 0 : row.getLong(2));
        }

        @Override
        public void close(Throwable error) {
            if (cache == null) {
                return;
            }
            try {
                if (error == null) {
                    cache.flush();
                }
            } catch (IOException e) {
                throw new java.io.UncheckedIOException(e);
            } finally {
                cache.clear();
            }
        }
    }

    /** The Real-time Mode window sink for rows campaign_id, event_time, pre_window_latency_ms. */
    public static ForeachWriter<Row> windowForeachWriter(String host, int port, String prefix, long windowMillis) {
        return new WindowCacheForeachWriter(host, port, prefix, windowMillis);
    }

    /**
     * YSB's join for Spark Continuous Processing, which has no joins: a lookup in the static
     * ad -> campaign table, loaded once per executor JVM from the Redis hash the runner filled
     * (YSB's own setup stores the table in Redis too). Register it with
     * spark.udf.registerJavaFunction(name, "ysb.RedisSink$CampaignJoin", "string"); the executors
     * read spark.ysb.redis.host/port and spark.ysb.redis.adsKey from their Spark configuration.
     */
    public static final class CampaignJoin implements UDF1<String, String> {
        private static final long serialVersionUID = 1L;
        private static volatile Map<String, String> table;

        @Override
        public String call(String adId) throws IOException {
            Map<String, String> campaigns = table;
            if (campaigns == null) {
                campaigns = load();
            }
            return campaigns.get(adId);
        }

        private static synchronized Map<String, String> load() throws IOException {
            if (table == null) {
                SparkConf conf = SparkEnv.get().conf();
                RespConnection redis = new RespConnection(
                    conf.get("spark.ysb.redis.host", "127.0.0.1"), conf.getInt("spark.ysb.redis.port", 6379));
                try {
                    table = redis.hgetall(utf8(conf.get("spark.ysb.redis.adsKey", "ysb:ad_campaign")));
                } finally {
                    redis.close();
                }
            }
            return table;
        }
    }

    /** HGET the window in the campaign's hash; when new, HSET it there and LPUSH it on the campaign's list. */
    static void registerWindow(RespConnection redis, String prefix, String campaign, byte[] windowStart,
                               byte[] windowKey) throws IOException {
        byte[] campaignKey = utf8(prefix + "campaign:" + campaign);
        if (redis.call(List.of(utf8("HGET"), campaignKey, windowStart)) == null) {
            redis.call(List.of(utf8("HSET"), campaignKey, windowStart, windowKey));
            redis.call(List.of(utf8("LPUSH"), utf8(prefix + "windows:" + campaign), windowStart));
        }
    }

    static int indexOf(StructField[] fields, String name) {
        for (int i = 1; i < fields.length; i++) {
            if (fields[i].name().equals(name)) {
                return i;
            }
        }
        return -1;
    }

    static byte[] utf8(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    static byte[] value(StructField[] fields, InternalRow row, int i) {
        if (row.isNullAt(i)) {
            return new byte[0];
        }
        DataType type = fields[i].dataType();
        String text;
        if (type.equals(DataTypes.StringType)) {
            return row.getUTF8String(i).getBytes();
        } else if (type.equals(DataTypes.LongType) || type.equals(DataTypes.TimestampType)) {
            text = Long.toString(row.getLong(i));
        } else if (type.equals(DataTypes.IntegerType) || type.equals(DataTypes.DateType)) {
            text = Integer.toString(row.getInt(i));
        } else if (type.equals(DataTypes.DoubleType)) {
            text = Double.toString(row.getDouble(i));
        } else {
            text = String.valueOf(row.get(i, type));
        }
        return text.getBytes(StandardCharsets.UTF_8);
    }
}

package ysb;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.functions.FilterFunction;
import org.apache.flink.api.common.functions.FlatMapFunction;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.api.java.tuple.Tuple3;
import org.apache.flink.api.java.tuple.Tuple4;
import org.apache.flink.api.java.tuple.Tuple6;
import org.apache.flink.api.java.tuple.Tuple7;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.connector.datagen.source.GeneratorFunction;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.windowing.ProcessWindowFunction;
import org.apache.flink.streaming.api.windowing.assigners.TumblingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.windows.TimeWindow;
import org.apache.flink.util.Collector;

/**
 * The Yahoo Streaming Benchmark on Flink's DataStream API, the same logical pipeline as the Spark
 * demo (coordinator/workloads/ysb/pipeline.py) and the paper's Flink job:
 *
 *   generated JSON ad events -> DeserializeBolt -> EventFilterBolt (views) -> ProjectionBolt
 *   -> RedisJoinBolt (static ad -> campaign cache) -> EnrichBolt (pre-window latency, event time)
 *   -> keyBy campaign -> 10 s event-time tumbling window (CampaignProcessor) -> RedisResultSink
 *
 * The function classes carry the YSB Flink job's names so that application_profiles/flink.txt tells
 * the steps apart (operators of one kind share Flink's StreamMap/StreamFlatMap frames). The source is
 * Flink's DataGeneratorSource, rate-limited, writing YSB's JSON; YsbFlinkKafka runs the same pipeline
 * on the records of a Kafka topic.
 *
 * usage: YsbFlink --rate N --ads FILE --redis-port P [--parallelism 2]
 *   FILE: one "ad_id campaign_id" pair per line (the Python side writes the same mapping as Spark's).
 */
public final class YsbFlink {
    static final String[] AD_TYPES = {"banner", "modal", "sponsored-search", "mail", "mobile"};
    static final String[] EVENT_TYPES = {"view", "click", "purchase"};
    static final long WINDOW_MS = 10_000L;

    private YsbFlink() {
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = arguments(argv);
        int rate = Integer.parseInt(args.getOrDefault("rate", "20000"));
        HashMap<String, String> adToCampaign = adCampaigns(args.get("ads"));
        String[] adIds = adToCampaign.keySet().stream().sorted().toArray(String[]::new);

        StreamExecutionEnvironment env = environment(args);
        DataGeneratorSource<String> source = new DataGeneratorSource<>(
            new EventGenerator(adIds), Long.MAX_VALUE, new PacedRateLimiterStrategy<>(rate), Types.STRING);
        run(env, env.fromSource(source, WatermarkStrategy.noWatermarks(), "YSB generator"), adToCampaign, args);
    }

    /** "--key value" pairs. */
    static Map<String, String> arguments(String[] argv) {
        Map<String, String> args = new HashMap<>();
        for (int i = 0; i + 1 < argv.length; i += 2) {
            args.put(argv[i].replaceFirst("^--", ""), argv[i + 1]);
        }
        return args;
    }

    /** The ad -> campaign table of FILE: one "ad_id campaign_id" pair per line. */
    static HashMap<String, String> adCampaigns(String file) throws IOException {
        HashMap<String, String> adToCampaign = new HashMap<>();
        for (String line : Files.readAllLines(Paths.get(file), StandardCharsets.UTF_8)) {
            String[] parts = line.trim().split("\\s+");
            if (parts.length == 2) {
                adToCampaign.put(parts[0], parts[1]);
            }
        }
        return adToCampaign;
    }

    static StreamExecutionEnvironment environment(Map<String, String> args) {
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.setParallelism(Integer.parseInt(args.getOrDefault("parallelism", "2")));
        return env;
    }

    /** YSB from the JSON ad events of ``events`` (the generator or Kafka) to the Redis sink; runs the job. */
    static void run(StreamExecutionEnvironment env, DataStream<String> events, HashMap<String, String> adToCampaign,
                    Map<String, String> args) throws Exception {
        int redisPort = Integer.parseInt(args.getOrDefault("redis-port", "6379"));
        DataStream<Tuple4<String, String, Long, Long>> enriched = events
            .flatMap(new DeserializeBolt()).name("DeserializeBolt")
            .filter(new EventFilterBolt()).name("EventFilterBolt")
            .map(new ProjectionBolt()).name("ProjectionBolt")
            .flatMap(new RedisJoinBolt(adToCampaign)).name("RedisJoinBolt")
            .map(new EnrichBolt()).name("EnrichBolt")
            .assignTimestampsAndWatermarks(
                WatermarkStrategy.<Tuple4<String, String, Long, Long>>forBoundedOutOfOrderness(Duration.ofSeconds(1))
                    .withTimestampAssigner((event, previous) -> event.f2))
            .name("EventTime");

        enriched
            .keyBy(new CampaignKey())
            .window(TumblingEventTimeWindows.of(Duration.ofMillis(WINDOW_MS)))
            .aggregate(new CampaignProcessor(), new CampaignWindow()).name("CampaignProcessor")
            .sinkTo(new RedisResultSink("127.0.0.1", redisPort, "ysb:")).name("RedisResultSink");

        env.execute("ysb");
    }

    /** YSB's generator: one JSON ad event per index; event_time is the wall clock at generation. */
    public static final class EventGenerator implements GeneratorFunction<Long, String> {
        private static final long serialVersionUID = 1L;
        private final String[] adIds;

        EventGenerator(String[] adIds) {
            this.adIds = adIds;
        }

        private static long mix(long x) {
            x = (x ^ (x >>> 30)) * 0xbf58476d1ce4e5b9L;
            x = (x ^ (x >>> 27)) * 0x94d049bb133111ebL;
            return x ^ (x >>> 31);
        }

        @Override
        public String map(Long index) {
            long i = index;
            long h = mix(i);
            StringBuilder json = new StringBuilder(256);
            json.append("{\"user_id\":\"").append(new java.util.UUID(h, mix(h)))
                .append("\",\"page_id\":\"").append(new java.util.UUID(mix(h + 1), mix(h + 2)))
                .append("\",\"ad_id\":\"").append(adIds[(int) Long.remainderUnsigned(h, adIds.length)])
                .append("\",\"ad_type\":\"").append(AD_TYPES[(int) Long.remainderUnsigned(h >>> 8, AD_TYPES.length)])
                .append("\",\"event_type\":\"").append(EVENT_TYPES[(int) Long.remainderUnsigned(i, EVENT_TYPES.length)])
                .append("\",\"event_time\":\"").append(System.currentTimeMillis())
                .append("\",\"ip_address\":\"").append((h >>> 16) & 255).append('.').append((h >>> 24) & 255)
                .append('.').append((h >>> 32) & 255).append('.').append((h >>> 40) & 255)
                .append("\"}");
            return json.toString();
        }
    }

    /** JSON text -> (user_id, page_id, ad_id, ad_type, event_type, event_time, ip_address). */
    public static final class DeserializeBolt
            implements FlatMapFunction<String, Tuple7<String, String, String, String, String, String, String>> {
        private static final long serialVersionUID = 1L;
        private transient ObjectMapper mapper;

        @Override
        public void flatMap(String input, Collector<Tuple7<String, String, String, String, String, String, String>> out)
                throws Exception {
            if (mapper == null) {
                mapper = new ObjectMapper();
            }
            JsonNode event = mapper.readTree(input);
            out.collect(new Tuple7<>(
                event.get("user_id").asText(), event.get("page_id").asText(), event.get("ad_id").asText(),
                event.get("ad_type").asText(), event.get("event_type").asText(), event.get("event_time").asText(),
                event.get("ip_address").asText()));
        }
    }

    public static final class EventFilterBolt
            implements FilterFunction<Tuple7<String, String, String, String, String, String, String>> {
        private static final long serialVersionUID = 1L;

        @Override
        public boolean filter(Tuple7<String, String, String, String, String, String, String> event) {
            return "view".equals(event.f4);
        }
    }

    /** Keeps ad_id and event_time. */
    public static final class ProjectionBolt
            implements MapFunction<Tuple7<String, String, String, String, String, String, String>, Tuple2<String, String>> {
        private static final long serialVersionUID = 1L;

        @Override
        public Tuple2<String, String> map(Tuple7<String, String, String, String, String, String, String> event) {
            return new Tuple2<>(event.f2, event.f5);
        }
    }

    /** ad_id -> campaign_id from the static cache (YSB's Redis lookup, cached); unknown ads are dropped. */
    public static final class RedisJoinBolt implements FlatMapFunction<Tuple2<String, String>, Tuple3<String, String, String>> {
        private static final long serialVersionUID = 1L;
        private final HashMap<String, String> adToCampaign;

        RedisJoinBolt(HashMap<String, String> adToCampaign) {
            this.adToCampaign = adToCampaign;
        }

        @Override
        public void flatMap(Tuple2<String, String> event, Collector<Tuple3<String, String, String>> out) {
            String campaign = adToCampaign.get(event.f0);
            if (campaign != null) {
                out.collect(new Tuple3<>(campaign, event.f0, event.f1));
            }
        }
    }

    /** (campaign_id, ad_id, event_time ms, pre-window latency ms = now - event time). */
    public static final class EnrichBolt
            implements MapFunction<Tuple3<String, String, String>, Tuple4<String, String, Long, Long>> {
        private static final long serialVersionUID = 1L;

        @Override
        public Tuple4<String, String, Long, Long> map(Tuple3<String, String, String> event) {
            long eventTime = Long.parseLong(event.f2);
            return new Tuple4<>(event.f0, event.f1, eventTime, System.currentTimeMillis() - eventTime);
        }
    }

    public static final class CampaignKey implements KeySelector<Tuple4<String, String, Long, Long>, String> {
        private static final long serialVersionUID = 1L;

        @Override
        public String getKey(Tuple4<String, String, Long, Long> event) {
            return event.f0;
        }
    }

    /** Per campaign and window: (events, latest event time, worst pre-window latency). */
    public static final class CampaignProcessor
            implements AggregateFunction<Tuple4<String, String, Long, Long>, Tuple3<Long, Long, Long>, Tuple3<Long, Long, Long>> {
        private static final long serialVersionUID = 1L;

        @Override
        public Tuple3<Long, Long, Long> createAccumulator() {
            return new Tuple3<>(0L, Long.MIN_VALUE, Long.MIN_VALUE);
        }

        @Override
        public Tuple3<Long, Long, Long> add(Tuple4<String, String, Long, Long> event, Tuple3<Long, Long, Long> acc) {
            return new Tuple3<>(acc.f0 + 1, Math.max(acc.f1, event.f2), Math.max(acc.f2, event.f3));
        }

        @Override
        public Tuple3<Long, Long, Long> getResult(Tuple3<Long, Long, Long> acc) {
            return acc;
        }

        @Override
        public Tuple3<Long, Long, Long> merge(Tuple3<Long, Long, Long> a, Tuple3<Long, Long, Long> b) {
            return new Tuple3<>(a.f0 + b.f0, Math.max(a.f1, b.f1), Math.max(a.f2, b.f2));
        }
    }

    /** (campaign_id, window_start_ms, events, last_event_time, max_pre_window_latency_ms, written_at_ms). */
    public static final class CampaignWindow extends
            ProcessWindowFunction<Tuple3<Long, Long, Long>, Tuple6<String, Long, Long, Long, Long, Long>, String, TimeWindow> {
        private static final long serialVersionUID = 1L;

        @Override
        public void process(String campaign, Context context, Iterable<Tuple3<Long, Long, Long>> counts,
                Collector<Tuple6<String, Long, Long, Long, Long, Long>> out) {
            for (Tuple3<Long, Long, Long> count : counts) {
                out.collect(new Tuple6<>(campaign, context.window().getStart(), count.f0, count.f1, count.f2,
                    System.currentTimeMillis()));
            }
        }
    }

    /**
     * YSB's Redis sink, the same commands as the Spark demo's (coordinator/workloads/ysb/RedisSink.java), one
     * synchronous command at a time (YSB uses a plain, unpipelined Jedis connection):
     *   HGET   ysb:campaign:<campaign_id> <window_start_ms>
     *   HSET   ysb:campaign:<campaign_id> <window_start_ms> <window key>   (new windows only)
     *   LPUSH  ysb:windows:<campaign_id> <window_start_ms>                  (new windows only)
     *   HSET   ysb:window:<campaign_id>:<window_start_ms> campaign_id .. events .. written_at_ms .. time_updated <now>
     * (time_updated: YSB's, the wall clock at this write, epoch ms; a window fires once, so it is its last update.)
     */
    public static final class RedisResultSink implements Sink<Tuple6<String, Long, Long, Long, Long, Long>> {
        private static final long serialVersionUID = 1L;
        private final String host;
        private final int port;
        private final String prefix;

        RedisResultSink(String host, int port, String prefix) {
            this.host = host;
            this.port = port;
            this.prefix = prefix;
        }

        @Override
        public SinkWriter<Tuple6<String, Long, Long, Long, Long, Long>> createWriter(WriterInitContext context)
                throws IOException {
            return new RedisWriter(host, port, prefix);
        }
    }

    static final class RedisWriter implements SinkWriter<Tuple6<String, Long, Long, Long, Long, Long>> {
        static final String[] FIELDS = {
            "campaign_id", "window_start_ms", "events", "last_event_time", "max_pre_window_latency_ms", "written_at_ms"};
        private final String prefix;
        private final RespConnection redis;

        RedisWriter(String host, int port, String prefix) {
            this.prefix = prefix;
            redis = new RespConnection(host, port);
        }

        private static byte[] utf8(String text) {
            return RespConnection.utf8(text);
        }

        @Override
        public void write(Tuple6<String, Long, Long, Long, Long, Long> row, Context context) throws IOException {
            String campaign = row.f0;
            byte[] windowStart = utf8(Long.toString(row.f1));
            byte[] windowKey = utf8(prefix + "window:" + campaign + ":" + row.f1);
            byte[] campaignKey = utf8(prefix + "campaign:" + campaign);
            if (call(List.of(utf8("HGET"), campaignKey, windowStart)) == null) {
                call(List.of(utf8("HSET"), campaignKey, windowStart, windowKey));
                call(List.of(utf8("LPUSH"), utf8(prefix + "windows:" + campaign), windowStart));
            }
            List<byte[]> args = new ArrayList<>(4 + 2 * FIELDS.length);
            args.add(utf8("HSET"));
            args.add(windowKey);
            for (int i = 0; i < FIELDS.length; i++) {
                args.add(utf8(FIELDS[i]));
                args.add(utf8(String.valueOf((Object) row.getField(i))));
            }
            args.add(utf8("time_updated"));
            args.add(utf8(Long.toString(System.currentTimeMillis())));
            call(args);
        }

        private String call(List<byte[]> args) throws IOException {
            return redis.call(args);
        }

        @Override
        public void flush(boolean endOfInput) {
        }

        @Override
        public void close() throws IOException {
            redis.close();
        }
    }
}
